"""The batching engine's one boundary with llama.cpp's C API.

One model, one context holding ``n_slots`` sequences, each with its own
``ctx_per_slot`` tokens of KV cache (``kv_unified`` off, so sequences never
compete for cache cells and attention only spans a sequence's own cells).
Every method must be called from the scheduler's worker thread; nothing here
is thread-safe. llama.cpp failures become :class:`servekit.errors.EngineFailure`
here and nowhere else.
"""

from __future__ import annotations

import ctypes
import logging
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from servekit.engine.llama_lib import llama_cpp
from servekit.engine.llama_vocab import LlamaVocab
from servekit.errors import EngineFailure

__all__ = ["BatchItem", "LlamaBatchModel"]


@dataclass(frozen=True, slots=True)
class BatchItem:
    """One token of a batch: its sequence (slot), position, and whether logits are wanted."""

    token: int
    pos: int
    seq: int
    logits: bool


class LlamaBatchModel(LlamaVocab):
    """A loaded model and a multi-sequence context, driven by raw batches; its
    vocabulary methods come from :class:`LlamaVocab`."""

    def __init__(
        self,
        model_path: str | Path,
        *,
        n_slots: int,
        ctx_per_slot: int,
        n_batch: int,
        n_threads: int,
    ) -> None:
        # llama-cpp-python routes llama.cpp's log through this logger; keep errors only.
        logging.getLogger("llama-cpp-python").setLevel(logging.ERROR)
        llama_cpp.llama_backend_init()
        mparams = llama_cpp.llama_model_default_params()
        self._model: Any = llama_cpp.llama_model_load_from_file(str(model_path).encode(), mparams)
        if not self._model:
            raise EngineFailure(f"llama.cpp could not load {model_path}")
        cparams = llama_cpp.llama_context_default_params()
        cparams.n_ctx = n_slots * ctx_per_slot
        cparams.n_batch = n_batch
        cparams.n_ubatch = n_batch
        cparams.n_seq_max = n_slots
        cparams.n_threads = n_threads
        cparams.n_threads_batch = n_threads
        cparams.kv_unified = False
        # As llama-cpp-python's Llama (the single-sequence engine) sets it: the same
        # attention kernels, so both engines compute the same logits.
        cparams.flash_attn_type = llama_cpp.LLAMA_FLASH_ATTN_TYPE_DISABLED
        cparams.no_perf = True
        self._ctx: Any = llama_cpp.llama_init_from_model(self._model, cparams)
        if not self._ctx:
            llama_cpp.llama_model_free(self._model)
            raise EngineFailure("llama.cpp could not create a context")
        self._mem = llama_cpp.llama_get_memory(self._ctx)
        self._vocab = llama_cpp.llama_model_get_vocab(self._model)
        self.n_vocab = int(llama_cpp.llama_vocab_n_tokens(self._vocab))
        self.n_batch = n_batch
        self.n_slots = n_slots
        self.ctx_per_slot = int(llama_cpp.llama_n_ctx_seq(self._ctx))
        if self.ctx_per_slot < ctx_per_slot:  # llama.cpp pads and rounds n_ctx
            llama_cpp.llama_free(self._ctx)
            llama_cpp.llama_model_free(self._model)
            raise EngineFailure(
                f"llama.cpp gave {self.ctx_per_slot} tokens per sequence, not {ctx_per_slot}"
            )
        self._batch = llama_cpp.llama_batch_init(n_batch, 0, 1)
        super().__init__(self._vocab)

    @property
    def ctx(self) -> Any:
        """The raw ``llama_context *`` (for samplers)."""
        return self._ctx

    @property
    def vocab(self) -> Any:
        return self._vocab

    def metadata(self, key: str) -> str | None:
        buf = ctypes.create_string_buffer(1 << 16)
        n = llama_cpp.llama_model_meta_val_str(self._model, key.encode(), buf, len(buf))
        return None if n < 0 else buf.value.decode("utf-8", "replace")

    def decode(self, items: Sequence[BatchItem]) -> None:
        """Evaluate one batch; the logits of item ``i`` (if requested) are at index ``i``."""
        if not items or len(items) > self.n_batch:
            raise EngineFailure(f"batch of {len(items)} tokens outside 1..{self.n_batch}")
        b = self._batch
        for i, it in enumerate(items):
            b.token[i] = it.token
            b.pos[i] = it.pos
            b.n_seq_id[i] = 1
            b.seq_id[i][0] = it.seq
            b.logits[i] = it.logits
        b.n_tokens = len(items)
        rc = llama_cpp.llama_decode(self._ctx, b)
        if rc != 0:
            raise EngineFailure(f"llama_decode failed with status {rc}")

    def copy(self, src: int, dst: int) -> None:
        """Make ``dst``'s cache a copy of ``src``'s (applied at the next decode).

        With one KV stream per sequence llama.cpp copies the whole stream; trim
        ``dst`` with :meth:`forget` afterwards to the prefix it should keep.
        """
        llama_cpp.llama_memory_seq_cp(self._mem, src, dst, -1, -1)

    def forget(self, seq: int, keep: int = 0) -> int:
        """Drop a sequence's cache from position ``keep`` on; return how many tokens remain."""
        if keep > 0 and llama_cpp.llama_memory_seq_rm(self._mem, seq, keep, -1):
            return keep
        # Removing a whole sequence never fails; a partial removal may be refused
        # (recurrent models), and then nothing of the prefix can be reused.
        llama_cpp.llama_memory_seq_rm(self._mem, seq, -1, -1)
        return 0

    def close(self) -> None:
        if self._ctx is None:
            return
        llama_cpp.llama_batch_free(self._batch)
        llama_cpp.llama_free(self._ctx)
        llama_cpp.llama_model_free(self._model)
        self._ctx = None
        self._model = None
