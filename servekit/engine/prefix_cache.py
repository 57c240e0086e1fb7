"""A prompt-prefix cache of llama.cpp context states.

``Llama.generate`` already reuses the common prefix with whatever is in the
context from the previous request. This cache keeps the states of earlier,
different prompts (system prompts, earlier turns) so that interleaved
conversations also skip their prefill. States come from llama.cpp's own state
API; only the bytes llama.cpp reports as used are kept, and the least recently
used entries are evicted past a byte budget. An entry serves only prompts of
the cache scope that saved it (the request's ``cache_salt``), so a tenant
cannot time another tenant's prompts out of it.
"""

from __future__ import annotations

import ctypes
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass

__all__ = ["PrefixStateCache", "SavedState", "common_prefix"]


def common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    n = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        n += 1
    return n


@dataclass(frozen=True, slots=True)
class SavedState:
    tokens: tuple[int, ...]
    data: bytearray
    salt: str | None = None  # the cache scope it serves


class PrefixStateCache:
    def __init__(self, capacity_bytes: int, min_tokens: int = 32) -> None:
        self.capacity_bytes = capacity_bytes
        self.min_tokens = min_tokens
        self._entries: OrderedDict[tuple[str | None, tuple[int, ...]], SavedState] = OrderedDict()
        self._size = 0

    @property
    def size_bytes(self) -> int:
        return self._size

    def __len__(self) -> int:
        return len(self._entries)

    def lookup(
        self, tokens: Sequence[int], salt: str | None = None
    ) -> tuple[SavedState | None, int]:
        """The entry of scope ``salt`` sharing the longest prefix with ``tokens``, and
        that length."""
        best: SavedState | None = None
        best_len = 0
        for entry in self._entries.values():
            if entry.salt != salt:
                continue
            n = common_prefix(entry.tokens, tokens)
            if n > best_len:
                best, best_len = entry, n
        if best is not None:
            self._entries.move_to_end((salt, best.tokens))
        return best, best_len

    def store(self, tokens: Sequence[int], data: bytearray, salt: str | None = None) -> None:
        key = (salt, tuple(tokens))
        if len(key[1]) < self.min_tokens or len(data) > self.capacity_bytes:
            return
        old = self._entries.pop(key, None)
        if old is not None:
            self._size -= len(old.data)
        self._entries[key] = SavedState(key[1], data, salt)
        self._size += len(data)
        while self._size > self.capacity_bytes and self._entries:
            _, evicted = self._entries.popitem(last=False)
            self._size -= len(evicted.data)


def read_context_state(llama_cpp_module: object, ctx: object) -> bytearray:
    """Copy a llama.cpp context's state (KV cells in use, last logits) out.

    One copy, straight into the buffer that is kept: a 1k-token context's state
    is ~25 MB, and each extra copy costs milliseconds of the request that saves it.
    """
    lib = llama_cpp_module
    size = int(lib.llama_state_get_size(ctx))  # type: ignore[attr-defined]
    data = bytearray(size)
    buf = (ctypes.c_uint8 * size).from_buffer(data)
    n = int(lib.llama_state_get_data(ctx, buf, size))  # type: ignore[attr-defined]
    del buf  # release the export so the bytearray may be resized
    if n < size:
        del data[n:]
    return data


def write_context_state(llama_cpp_module: object, ctx: object, data: bytearray) -> None:
    """Load a state saved by :func:`read_context_state` (read in place, not copied)."""
    lib = llama_cpp_module
    buf = (ctypes.c_uint8 * len(data)).from_buffer(data)
    if int(lib.llama_state_set_data(ctx, buf, len(data))) != len(data):  # type: ignore[attr-defined]
        raise RuntimeError("llama.cpp refused the saved state")
