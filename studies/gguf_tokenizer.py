"""Export a GGUF model's BPE tokenizer as a Hugging Face ``tokenizer.json``.

Load generators that count tokens client-side (aiperf, genai-perf) need a
Hugging Face tokenizer; on a machine without a model hub, the GGUF file we
serve already carries it. Run with an environment that has ``gguf`` and
``tokenizers`` (e.g. the one aiperf is installed in)::

    python studies/gguf_tokenizer.py models/SmolLM2-135M-Instruct.Q4_1.gguf var/smollm2-tokenizer

Supports GPT-2 style byte-level BPE (``tokenizer.ggml.model == "gpt2"``),
which covers SmolLM2, Llama 3 and Qwen 2.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any


def _strings(reader: Any, key: str) -> list[str]:
    field = reader.fields[key]
    return [bytes(field.parts[i]).decode("utf-8") for i in field.data]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("gguf", type=Path, help="the GGUF model file")
    p.add_argument("out", type=Path, help="directory for tokenizer.json")
    args = p.parse_args()
    # Imported here: they live in the aiperf environment, not in .venv.
    from gguf import GGUFReader  # type: ignore[import-not-found]
    from tokenizers import (  # type: ignore[import-not-found]
        Tokenizer,
        decoders,
        models,
        pre_tokenizers,
    )

    gguf_path, out = args.gguf, args.out
    reader = GGUFReader(gguf_path)
    kind = bytes(reader.fields["tokenizer.ggml.model"].parts[-1]).decode()
    if kind != "gpt2":
        raise SystemExit(f"{gguf_path}: tokenizer {kind!r} is not byte-level BPE")
    tokens = _strings(reader, "tokenizer.ggml.tokens")
    merges = _strings(reader, "tokenizer.ggml.merges")
    vocab = {tok: i for i, tok in enumerate(tokens)}
    pairs = [tuple(m.split(" ", 1)) for m in merges]
    tok = Tokenizer(models.BPE(vocab, pairs))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    out.mkdir(parents=True, exist_ok=True)
    tok.save(str(out / "tokenizer.json"))
    config = {"tokenizer_class": "PreTrainedTokenizerFast", "model_max_length": 8192}
    (out / "tokenizer_config.json").write_text(json.dumps(config))
    print(f"{out}: {len(vocab)} tokens, {len(pairs)} merges")


if __name__ == "__main__":
    main()
