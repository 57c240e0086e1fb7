"""llama.cpp's vocabulary as the engines need it: one implementation for both.

Implements :class:`servekit.engine.prompting.Tokenizer` over a raw
``llama_vocab *`` so the single-sequence and batching engines tokenize,
render pieces and recognise end-of-generation tokens identically.
"""

from __future__ import annotations

import ctypes
from typing import Any

from servekit.engine.llama_lib import llama_cpp

__all__ = ["LlamaVocab"]


class LlamaVocab:
    def __init__(self, vocab: Any) -> None:
        self._vocab = vocab
        self._pieces: dict[int, bytes] = {}
        self.bos = int(llama_cpp.llama_vocab_bos(vocab))  # -1: none
        self.eos = int(llama_cpp.llama_vocab_eos(vocab))

    def tokenize(self, text: bytes, add_bos: bool, special: bool) -> list[int]:
        cap = len(text) + 16
        while True:
            buf = (llama_cpp.llama_token * cap)()
            n = llama_cpp.llama_tokenize(self._vocab, text, len(text), buf, cap, add_bos, special)
            if n >= 0:
                return list(buf[:n])
            cap = -n

    def piece(self, token: int) -> bytes:
        """The bytes one token renders to (special tokens render as nothing)."""
        cached = self._pieces.get(token)
        if cached is None:
            cached = self._pieces[token] = self._render(token, special=False)
        return cached

    def is_eog(self, token: int) -> bool:
        return bool(llama_cpp.llama_vocab_is_eog(self._vocab, token))

    def add_bos(self) -> bool:
        return bool(llama_cpp.llama_vocab_get_add_bos(self._vocab))

    def special_text(self, which: str) -> str:
        """The text of the ``bos`` or ``eos`` token, as chat templates see it."""
        token = self.bos if which == "bos" else self.eos
        return "" if token < 0 else self._render(token, special=True).decode("utf-8", "replace")

    def _render(self, token: int, *, special: bool) -> bytes:
        size = 64
        while True:
            buf = ctypes.create_string_buffer(size)
            n = int(llama_cpp.llama_token_to_piece(self._vocab, token, buf, size, 0, special))
            if n >= 0:
                return buf.raw[:n]
            size = -n
