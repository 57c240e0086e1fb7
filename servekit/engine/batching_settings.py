"""Settings of the batching llama.cpp engine, apart from the engine itself.

A settings file that names ``engine: llama-batching`` validates without
loading llama.cpp: the engine (:mod:`servekit.engine.batching`) imports it
only where a process actually builds one.
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

__all__ = ["BatchingSettings"]


class BatchingSettings(BaseModel):
    """Settings of the batching llama.cpp engine (``engine: llama-batching``).

    Field names shared with :class:`~servekit.engine.llama.LlamaSettings` mean
    the same thing; ``slots`` x ``ctx_per_slot`` replaces its ``n_ctx``.
    """

    model_config = ConfigDict(extra="forbid", protected_namespaces=())
    model_path: Path = Field(description="GGUF file to load.")
    model_name: str = Field(min_length=1, description="Name clients address the model by.")
    slots: int = Field(4, ge=1, le=64, description="Sequences decoded together (n_seq_max).")
    ctx_per_slot: int = Field(
        2048, ge=64, description="KV cache per slot in tokens: prompt plus completion must fit."
    )
    chunk_tokens: int = Field(
        128,
        ge=1,
        description="Prompt tokens prefilled per step, interleaved with decoding; smaller keeps "
        "running streams smoother, larger gives new requests their first token sooner.",
    )
    prefill_order: Literal["shortest", "arrival"] = Field(
        "shortest",
        description="Which prompts a step's prefill budget goes to first: the fewest tokens "
        "left to prefill (a short question is not held behind a long document admitted "
        "before it) or first-come first-served.",
    )
    n_threads: int = Field(2, ge=1, description="CPU threads for llama.cpp.")
    seed: int | None = Field(None, description="Default sampling seed.")
    warmup_tokens: int = Field(4, ge=0, description="Tokens generated before ready.")
    default_max_tokens: int | None = Field(
        None, ge=1, description="Cap when a request sets no max_tokens (default: the slot)."
    )
    chat_template: str | None = Field(None, description="Override the GGUF's chat template.")
    prefix_report_block_chars: int = Field(
        64,
        ge=0,
        description="Report what the slots hold in /load as chained names of blocks of this "
        "many characters (the routers' prefix_cache.block_chars); 0 reports nothing.",
    )
    prefix_report_stride: int = Field(
        4, ge=1, description="Report every n-th block name of each held prompt (and its last)."
    )

    @model_validator(mode="after")
    def _chunk_fits(self) -> BatchingSettings:
        if self.chunk_tokens >= self.ctx_per_slot:
            raise ValueError("chunk_tokens must be smaller than ctx_per_slot")
        return self

    @property
    def n_batch(self) -> int:
        """Largest batch one step builds: one token per slot plus a prefill chunk."""
        return self.slots + self.chunk_tokens
