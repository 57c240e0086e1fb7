"""Turn a GGUF file into an HF-layout model directory that vLLM serves.

Runs in the vLLM environment (transformers, torch, gguf, accelerate), not in
the project's: ``.vllm/bin/python scripts/gguf_to_hf.py MODEL.gguf OUT_DIR``.
transformers reads the GGUF (dequantizing its tensors), and the model is saved
as bf16 safetensors with its tokenizer and chat template. No model hub is
involved.
"""

from __future__ import annotations

import sys
from pathlib import Path


def convert(gguf: Path, out: Path) -> None:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer, GgufConfig

    src, name = str(gguf.parent), gguf.name
    tokenizer = AutoTokenizer.from_pretrained(src, gguf_file=name)
    model = AutoModelForCausalLM.from_pretrained(
        src,
        gguf_file=name,
        quantization_config=GgufConfig(dequantize=True),
        dtype=torch.bfloat16,
    )
    # Dequantized weights are plain tensors now; a quantizer left attached
    # would make save_pretrained write a quantization config vLLM rejects.
    model.hf_quantizer = None
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    if not (out / "chat_template.jinja").is_file() and not tokenizer.chat_template:
        raise SystemExit(f"{gguf} carries no chat template")


if __name__ == "__main__":
    if len(sys.argv) != 3:
        raise SystemExit("usage: gguf_to_hf.py MODEL.gguf OUT_DIR")
    convert(Path(sys.argv[1]), Path(sys.argv[2]))
