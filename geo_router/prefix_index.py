"""What each instance holds in its prefix cache: its own report, else what this router sent it.

Engines keep the KV cache of recent prompts (vLLM's automatic prefix caching,
llama.cpp's per-slot cache), so a request that repeats a system prompt or a
conversation's history prefills only the rest. As SGLang's and vLLM Router's
cache-aware policies do, the router names a request's conversation in blocks:

- the conversation is serialized as the engine reads it (each message's role
  and text, in order) and cut into blocks of ``block_chars`` characters;
  block *i* is named by a hash chained over blocks 0..*i*
  (``servekit.prefix_blocks``: the same names in every process), so one
  block's name stands for its whole prefix;
- an instance that reports what it holds (``prefix_blocks`` in its load
  report: a sample of the block names of the prompts its slots hold) is
  believed: several routers' traffic shows in it, and so does an eviction
  or a restart. Between reports, what this router sent it since it first saw
  the report counts too;
- an answer streamed to the end is recorded where it was served, as the
  conversation's next turn will send it back (its last assistant turn):
  engines keep the tokens they generated beside the prompt's (a llama.cpp
  slot; vLLM's full blocks), and a next turn sent before the instance's
  next report was otherwise credited only its first turn's prompt
  (ShareGPT-like chat through ``hybrid-llm up``: turns sent right after
  their answer found 0 of their history's tokens known, and went elsewhere);
- for an instance that reports nothing, the router keeps an LRU set of block
  names it sent there (bounded: ``max_blocks``, or what the instance's slots
  and context window can hold when it reports them); entries unused for
  ``ttl_s`` are forgotten;
- a request's cached estimate at an instance is its leading run of blocks
  held there, converted to tokens at the router's rate for its text;
- names are per cache scope: a request's chain starts from its tenant's
  ``cache_salt`` (``servekit.prefix_blocks.scope_seed``), and engines name
  what their slots hold the same way, so the index is keyed by scope as well
  as instance without a table per scope. A prefix another tenant left on an
  instance earns this request no placement credit (it would get no cache hit
  there either: engines salt their caches alike), and so placement cannot
  tell one tenant what another sent.

Without reports it is an estimate of this router's traffic only: the load
bound in scoring, the engines' admission budgets and failover cover the
difference.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass, replace

from geo_router.conversation import Turn
from servekit.engine.protocol import LoadReport
from servekit.prefix_blocks import chained_names, conversation_text, leading_run, scope_seed

__all__ = ["Cached", "Prefix", "PrefixIndex"]


@dataclass(frozen=True, slots=True)
class Prefix:
    """A request's chained block names and how many tokens one block stands for."""

    blocks: tuple[int, ...]
    tokens_per_block: float
    # The name of the block that ends the conversation's opening (its first
    # ``anchor_chars``): where no instance holds the prefix yet, every router
    # places it by this alike (see scoring).
    anchor: int = 0

    def tokens(self, n_blocks: int) -> int:
        return int(n_blocks * self.tokens_per_block)


EMPTY = Prefix((), 0.0)


@dataclass(frozen=True, slots=True)
class Cached:
    """Leading blocks an instance holds, and whose word it is: ``reported`` (the
    instance's own load report), ``router`` (what this router sent it) or ``none``."""

    blocks: int
    source: str


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
        # per instance: the report's names (the object, to spot a new report), as
        # a set, and when this router first saw that report
        self._reports: dict[str, tuple[object, frozenset[int], float]] = {}
        # per prefix anchor: rent paid for serving it away from a same-city edge, and
        # when last (``geo_router.planner``: moving a prefix home, priced)
        self._rent: OrderedDict[int, tuple[float, float]] = OrderedDict()

    def prefix(
        self,
        turns: Sequence[Turn],
        prompt_tokens: int,
        max_chars: int = 65536,
        cache_salt: str | None = None,
    ) -> Prefix:
        """The chained block names of a conversation (only whole blocks count) in
        the cache scope of ``cache_salt``."""
        text = conversation_text((t.role, t.text) for t in turns)[:max_chars]
        size = self.block_chars
        blocks = chained_names(text, size, scope_seed(cache_salt))
        if not blocks:
            return EMPTY
        anchor = blocks[min(len(blocks), max(1, self.anchor_chars // size)) - 1]
        return Prefix(tuple(blocks), prompt_tokens * size / max(1, len(text)), anchor)

    def cached_blocks(
        self,
        instance_id: str,
        prefix: Prefix,
        report: LoadReport | None = None,
        now: float | None = None,
        report_age_s: float | None = None,
    ) -> Cached:
        """How many of ``prefix``'s leading blocks the instance holds, by its own
        ``report`` where it gives one in this index's block size, else by this router's
        record. ``report_age_s``: how long ago the report was taken, where known; what
        this router sent since then is not in it."""
        if not prefix.blocks:
            return Cached(0, "none")
        now = time.monotonic() if now is None else now
        horizon = now - self.ttl_s
        reported = 0
        names = None if report is None else report.prefix_blocks
        if (
            names is not None
            and report is not None
            and report.prefix_block_chars == self.block_chars
        ):
            held_set, first_seen = self._reported(instance_id, names, now)
            reported = leading_run(prefix.blocks, held_set)
            # Older sends are in the report, or evicted. It was taken when it was asked
            # for, which may be well before this router first looked at it: an answer
            # that ended in between is not in it (a chat's next turn, sent half a
            # second after its answer, found its history credited neither way).
            taken = first_seen if report_age_s is None else now - max(0.0, report_age_s)
            horizon = max(horizon, taken)
        own = self._own_run(instance_id, prefix, horizon)
        if reported and reported >= own:
            return Cached(reported, "reported")
        return Cached(own, "router") if own else Cached(0, "none")

    def _reported(
        self, instance_id: str, names: tuple[int, ...], now: float
    ) -> tuple[frozenset[int], float]:
        known = self._reports.get(instance_id)
        if known is not None and known[0] is names:
            return known[1], known[2]
        held = frozenset(names)
        self._reports[instance_id] = (names, held, now)
        return held, now

    def _own_run(self, instance_id: str, prefix: Prefix, horizon: float) -> int:
        held = self._held.get(instance_id)
        if not held:
            return 0
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

    def answered(
        self,
        instance_id: str,
        turns: Sequence[Turn],
        answer: str,
        *,
        tokens_per_block: float,
        cache_salt: str | None = None,
        limit_tokens: int | None = None,
        max_chars: int = 65536,
        now: float | None = None,
    ) -> None:
        """The instance streamed ``answer`` to the conversation ``turns``: it holds the
        conversation with that answer as its last assistant turn (see above)."""
        if not answer:
            return
        held = self.prefix([*turns, Turn("assistant", answer)], 0, max_chars, cache_salt)
        held = replace(held, tokens_per_block=tokens_per_block)
        self.record(instance_id, held, limit_tokens, now)

    def rent_paid(self, anchor: int, now: float | None = None) -> float:
        """Rent paid lately (within ``ttl_s`` of its last payment) for the prefix
        opening with ``anchor``."""
        paid = self._rent.get(anchor)
        now = time.monotonic() if now is None else now
        if paid is None or now - paid[1] > self.ttl_s:
            return 0.0
        return paid[0]

    def served(
        self,
        instance_id: str,
        prefix: Prefix,
        limit_tokens: int | None = None,
        *,
        warming: bool = False,
        rent_ms: float = 0.0,
        now: float | None = None,
    ) -> None:
        """A request of ``prefix`` was served by the instance (:meth:`record`); it moved
        the prefix home (``warming``: its rent is settled) or paid ``rent_ms`` for
        being served away from a same-city edge (``geo_router.planner``)."""
        now = time.monotonic() if now is None else now
        self.record(instance_id, prefix, limit_tokens, now)
        anchor = prefix.anchor
        if warming:
            self._rent.pop(anchor, None)
        elif rent_ms > 0:
            self._rent[anchor] = (self.rent_paid(anchor, now) + rent_ms, now)
            self._rent.move_to_end(anchor)
            while len(self._rent) > self.max_blocks:
                self._rent.popitem(last=False)

    def forget_missing(self, present: set[str]) -> None:
        for iid in [i for i in self._held if i not in present]:
            del self._held[iid]
        for iid in [i for i in self._reports if i not in present]:
            del self._reports[iid]

    def size(self, instance_id: str) -> int:
        return len(self._held.get(instance_id, ()))
