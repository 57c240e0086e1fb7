"""Choosing a replica: least-loaded, with prefix affinity under a load bound.

Requests that share a prompt prefix (a long system prompt, an ongoing
conversation) should land on the replica whose prefix cache already holds it.
Plain consistent hashing does that but lets one hot prefix swamp its replica,
so this uses *consistent hashing with bounded loads* (Mirrokni, Thorup,
Zadimoghaddam 2018): walk the ring clockwise from the prefix's point and take
the first replica whose load after this request stays within ``(1+ε)`` times
its fair share of the total. A prefix keeps its replica until that replica is
genuinely busier than the others, then spills to the next one on the ring
(the same one every time, so the spill is sticky too).

A home that is already full (in flight ≥ capacity) is also passed over while
another replica has room: a warm prefix cache does not pay for waiting
behind a whole batch.

A replica that refused a request (429) ranks last while its back-off lasts
(the upstream's ``Retry-After``, else ``shed_backoff_s``; the router treats
its instances alike): it is chosen only when every candidate refused.

Without a prefix the least-loaded replica wins. Load is what the gateway has
in flight there plus what the engine last reported beyond that (other
clients' traffic), as a share of its capacity, plus KV-cache fullness
weighted by ``kv_cache_weight``.

Everything here is pure and synchronous: the pool passes in a snapshot.
"""

from __future__ import annotations

import bisect
import hashlib
import math
from collections.abc import Sequence
from dataclasses import dataclass

from central.settings import BalancingSettings
from servekit.engine.protocol import GenerationRequest
from servekit.prefix_blocks import conversation_text

__all__ = ["Balancer", "Candidate", "prefix_key"]


@dataclass(frozen=True, slots=True)
class Candidate:
    """One healthy replica's load, as the balancer sees it."""

    name: str
    capacity: int
    inflight: int = 0
    external: int = 0
    kv_cache_usage: float | None = None
    refused: bool = False  # backing off after a 429

    @property
    def pending(self) -> int:
        """Requests on the replica: ours in flight plus others' the engine reported."""
        return self.inflight + self.external


def prefix_key(request: GenerationRequest, chars: int) -> str | None:
    """The part of the prompt a replica's prefix cache would reuse.

    For chat it is the conversation before the newest message (the system
    prompt and history), or the only message when there is just one; for a
    raw completion it is the prompt's start. ``None`` when there is nothing.
    """
    if request.messages is not None:
        messages = request.messages
        shared = messages[:-1] if len(messages) > 1 else messages
        text = conversation_text((m.role, m.content) for m in shared)
    else:
        text = request.prompt or ""
    return text[:chars] or None


def _point(data: str) -> int:
    return int.from_bytes(hashlib.blake2b(data.encode("utf-8"), digest_size=8).digest(), "big")


class Balancer:
    """Picks a replica for a request from a snapshot of candidates."""

    def __init__(self, settings: BalancingSettings, replica_names: Sequence[str]) -> None:
        self._settings = settings
        ring = sorted(
            (_point(f"{name}#{i}"), name)
            for name in replica_names
            for i in range(settings.virtual_nodes)
        )
        self._points = [p for p, _ in ring]
        self._owners = [n for _, n in ring]
        self._turn = 0

    def score(self, c: Candidate) -> float:
        kv = (c.kv_cache_usage or 0.0) * self._settings.kv_cache_weight
        return c.pending / max(1, c.capacity) + kv

    def choose(self, candidates: Sequence[Candidate], key: str | None) -> Candidate | None:
        """The replica for a request with prefix ``key``; None if there are no candidates."""
        if not candidates:
            return None
        candidates = [c for c in candidates if not c.refused] or candidates
        if key is not None and self._settings.prefix_affinity and self._points:
            home = self._bounded_home(candidates, key)
            if home is not None:
                return home
        return self.least_loaded(candidates)

    def least_loaded(self, candidates: Sequence[Candidate]) -> Candidate:
        best = min(self.score(c) for c in candidates)
        tied = [c for c in candidates if self.score(c) == best]
        # Rotate among equally loaded replicas so an idle pool still spreads.
        self._turn += 1
        return tied[self._turn % len(tied)]

    def _bounded_home(self, candidates: Sequence[Candidate], key: str) -> Candidate | None:
        by_name = {c.name: c for c in candidates}
        total = sum(c.pending for c in candidates) + 1
        total_capacity = sum(max(1, c.capacity) for c in candidates)
        eps = self._settings.load_bound
        room_elsewhere = any(c.pending < c.capacity for c in candidates)
        start = bisect.bisect_left(self._points, _point(key))
        seen: set[str] = set()
        n = len(self._owners)
        for step in range(n):
            name = self._owners[(start + step) % n]
            if name in seen or name not in by_name:
                continue
            seen.add(name)
            c = by_name[name]
            bound = math.ceil((1.0 + eps) * total * max(1, c.capacity) / total_capacity)
            full = c.pending >= c.capacity
            if c.pending + 1 <= bound and not (full and room_elsewhere):
                return c
            if len(seen) == len(by_name):
                break
        return None
