"""What each instance probably holds in its prefix cache, from what this router sent it.

Engines keep the KV cache of recent prompts (vLLM's automatic prefix caching,
llama.cpp's per-slot cache), so a request that repeats a system prompt or a
conversation's history prefills only the rest. The router cannot see those
caches; it keeps an approximate copy of them, as SGLang's and vLLM Router's
cache-aware policies do:

- a request's conversation is serialized as the engine reads it (each
  message's role and text, in order) and cut into blocks of ``block_chars``
  characters; block *i* is named by a hash chained over blocks 0..*i*
  (vLLM's block hashing), so one block's name stands for its whole prefix;
- each instance has an LRU set of block names the router sent it (bounded:
  ``max_blocks``, or what the instance's slots and context window can hold
  when it reports them), and entries unused for ``ttl_s`` are forgotten;
- a request's cached estimate at an instance is its leading run of blocks
  present there, converted to tokens at the router's rate for its text.

It is an estimate: an engine may evict sooner (another prompt took the slot)
or hold more (another router's traffic); the load bound in scoring, the
engines' admission budgets and failover cover the difference.
"""

from __future__ import annotations

import hashlib
import time
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass

from geo_router.conversation import Turn

__all__ = ["Prefix", "PrefixIndex"]


@dataclass(frozen=True, slots=True)
class Prefix:
    """A request's chained block names and how many tokens one block stands for."""

    blocks: tuple[int, ...]
    tokens_per_block: float
    # A hash of the conversation's opening (its first ``anchor_chars``) that every
    # router computes alike (``hash()`` of a str is salted per process): where no
    # instance holds the prefix yet, routers place it by this (see scoring).
    anchor: int = 0

    def tokens(self, n_blocks: int) -> int:
        return int(n_blocks * self.tokens_per_block)


EMPTY = Prefix((), 0.0)


class PrefixIndex:
    """Per-instance LRU of block names; not thread-safe (the router's event loop owns it)."""

    def __init__(
        self,
        *,
        block_chars: int = 64,
        max_blocks: int = 8192,
        ttl_s: float = 600.0,
        anchor_chars: int = 1024,
    ) -> None:
        self.block_chars = block_chars
        self.anchor_chars = anchor_chars
        self.max_blocks = max_blocks
        self.ttl_s = ttl_s
        self._held: dict[str, OrderedDict[int, float]] = {}

    def prefix(self, turns: Sequence[Turn], prompt_tokens: int, max_chars: int = 65536) -> Prefix:
        """The chained block names of a conversation (only whole blocks count)."""
        text = "".join(f"{t.role}\x1f{t.text}\x1e" for t in turns)[:max_chars]
        size = self.block_chars
        n = len(text) // size
        if n == 0:
            return EMPTY
        blocks: list[int] = []
        h = 0
        for i in range(n):
            h = hash((h, text[i * size : (i + 1) * size]))
            blocks.append(h)
        opening = text[: self.anchor_chars].encode("utf-8", "surrogatepass")
        anchor = int.from_bytes(hashlib.blake2b(opening, digest_size=8).digest(), "big")
        return Prefix(tuple(blocks), prompt_tokens * size / max(1, len(text)), anchor)

    def cached_blocks(self, instance_id: str, prefix: Prefix, now: float | None = None) -> int:
        """How many of ``prefix``'s leading blocks the instance probably still holds."""
        held = self._held.get(instance_id)
        if not held or not prefix.blocks:
            return 0
        now = time.monotonic() if now is None else now
        horizon = now - self.ttl_s
        count = 0
        for block in prefix.blocks:
            seen = held.get(block)
            if seen is None or seen < horizon:
                break
            count += 1
        return count

    def record(
        self,
        instance_id: str,
        prefix: Prefix,
        limit_tokens: int | None = None,
        now: float | None = None,
    ) -> None:
        """``prefix`` was sent to the instance, which holds ``limit_tokens`` of KV at most."""
        if not prefix.blocks:
            return
        now = time.monotonic() if now is None else now
        held = self._held.setdefault(instance_id, OrderedDict())
        for block in prefix.blocks:
            held[block] = now
            held.move_to_end(block)
        cap = self.max_blocks
        if limit_tokens is not None and prefix.tokens_per_block > 0:
            cap = max(len(prefix.blocks), min(cap, int(limit_tokens / prefix.tokens_per_block)))
        while len(held) > cap:
            held.popitem(last=False)

    def forget_missing(self, present: set[str]) -> None:
        for iid in [i for i in self._held if i not in present]:
            del self._held[iid]

    def size(self, instance_id: str) -> int:
        return len(self._held.get(instance_id, ()))
