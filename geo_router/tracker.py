"""What the router itself knows about each instance: circuit, in-flight, recent TTFT.

The circuit breaker is per instance: ``failures`` consecutive failures open
it; while open the instance gets no traffic; after ``open_s`` it turns
half-open and lets exactly one request through as a probe. The probe's
success closes the circuit (and restarts the slow-start ramp, since a
recovered instance is cold); its failure reopens it for twice as long.

A refusal (429: the instance's queue is full or it predicts it cannot start
the request within its TTFT budget) is not a failure: the instance is healthy
and busy. :meth:`Tracker.refused` only ranks it behind candidates that can
start in time for a moment (``routing.shed_backoff_s``).

Each instance's TTFT model (``geo_router.predictor``) lives with its other
figures here: it learns from the first tokens :meth:`Tracker.success` is
told of, and is forgotten with them when the instance leaves the catalog.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from enum import IntEnum

from geo_router.predictor import Prediction, TtftModel
from geo_router.routing_settings import BreakerSettings, PredictionSettings
from servekit.registry.protocol import InstanceState

__all__ = ["Circuit", "InstanceStats", "Tracker"]


class Circuit(IntEnum):
    CLOSED = 0
    HALF_OPEN = 1
    OPEN = 2


@dataclass
class InstanceStats:
    first_seen: float
    model: TtftModel  # predicts a request's TTFT there
    circuit: Circuit = Circuit.CLOSED
    failures: int = 0
    opened_at: float = 0.0
    open_for: float = 0.0
    probing: bool = False
    refused_until: float = 0.0  # monotonic; a 429 there ranks it last until then
    inflight: int = 0
    ttft_ms: deque[float] = field(default_factory=lambda: deque(maxlen=200))
    # Wall-clock ends of the router's requests there (to discount stale load reports).
    released: deque[float] = field(default_factory=lambda: deque(maxlen=64))

    def released_since(self, wall: float) -> int:
        return sum(1 for t in self.released if t > wall)

    def ttft_p95_ms(self) -> float | None:
        if len(self.ttft_ms) < 5:
            return None
        ordered = sorted(self.ttft_ms)
        return ordered[min(len(ordered) - 1, int(len(ordered) * 0.95))]


class Tracker:
    """``clock`` times circuits, back-offs and the predictor (monotonic); ``wall`` stamps
    releases, compared with load reports' heartbeats (wall-clock). A simulation passes
    its virtual time as both."""

    def __init__(
        self,
        breaker: BreakerSettings,
        prediction: PredictionSettings | None = None,
        *,
        clock: Callable[[], float] = time.monotonic,
        wall: Callable[[], float] = time.time,
    ) -> None:
        self._clock, self._wall = clock, wall
        self._settings = breaker
        self._prediction = prediction or PredictionSettings()
        self._stats: dict[str, InstanceStats] = {}
        # Per tier, what requests with nothing to prefill took there beyond their RTT:
        # an instance with none of its own is priced from its tier's. One pool for the
        # fleet priced an edge's first repeat from the center's, which pass one more hop
        # (ShareGPT one at a time: 70-77 ms predicted, 33-47 ms taken).
        self._quick_pools: dict[str, deque[float]] = {}

    def report_age_s(self, state: InstanceState) -> float | None:
        """How long ago the instance's load report was taken, by the ``wall`` clock its
        heartbeat is stamped on (``None`` when it has none)."""
        return self._wall() - state.last_heartbeat if state.last_heartbeat > 0 else None

    def stats(self, instance_id: str, tier: str | None = None) -> InstanceStats:
        """An instance's statistics; ``tier`` (the scorer's) joins its model to that
        tier's pool of quick requests (see above)."""
        found = self._stats.get(instance_id)
        if found is None:
            found = InstanceStats(self._clock(), TtftModel(self._prediction))
            self._stats[instance_id] = found
        if tier is not None and found.model.pool is None:
            pool = self._quick_pools.get(tier)
            if pool is None:
                pool = self._quick_pools[tier] = deque(maxlen=self._prediction.window)
            found.model.pool = pool
        return found

    def items(self) -> list[tuple[str, InstanceStats]]:
        return list(self._stats.items())

    def forget_missing(self, present: set[str]) -> None:
        """Drop instances that left the catalog, so a return counts as new (slow start)."""
        for iid in [i for i in self._stats if i not in present]:
            if self._stats[iid].inflight == 0:
                del self._stats[iid]

    def available(self, instance_id: str) -> bool:
        """May a request go there now? A pure read (``/v1/route/explain`` asks too):
        an open circuit past its open time admits one probe, and only the probe's
        :meth:`acquire` turns it half-open."""
        s = self._stats.get(instance_id)
        if s is None:
            return True
        if s.circuit is Circuit.OPEN:
            return self._clock() - s.opened_at >= s.open_for
        return not (s.circuit is Circuit.HALF_OPEN and s.probing)

    def acquire(self, instance_id: str) -> None:
        """A request goes there; through an open circuit past its time, it is the probe."""
        s = self.stats(instance_id)
        s.inflight += 1
        if s.circuit is Circuit.OPEN and self._clock() - s.opened_at >= s.open_for:
            s.circuit = Circuit.HALF_OPEN
        if s.circuit is Circuit.HALF_OPEN:
            s.probing = True

    def release(self, instance_id: str) -> None:
        """A request there ended (stamped with the ``wall`` clock)."""
        s = self.stats(instance_id)
        s.inflight = max(0, s.inflight - 1)
        s.released.append(self._wall())

    def success(
        self,
        instance_id: str,
        ttft_ms: float | None = None,
        predicted: Prediction | None = None,
    ) -> None:
        """It primed after ``ttft_ms``; with what was ``predicted``, the model learns."""
        s = self.stats(instance_id)
        if ttft_ms is not None:
            s.ttft_ms.append(ttft_ms)
            if predicted is not None:
                s.model.observe(predicted, ttft_ms, self._clock())
        if s.circuit is not Circuit.CLOSED:
            s.first_seen = self._clock()  # recovered: ramp up again
        s.circuit = Circuit.CLOSED
        s.failures = 0
        s.open_for = 0.0
        s.probing = False

    def late(self, instance_id: str, waited_ms: float, predicted: Prediction | None) -> None:
        """No first token within its deadline: the model learns a lower bound (the
        failure itself is :meth:`failure`'s)."""
        if predicted is not None:
            self.stats(instance_id).model.censored(predicted, waited_ms)

    def failure(self, instance_id: str) -> None:
        s = self.stats(instance_id)
        now = self._clock()
        s.failures += 1
        if s.circuit is Circuit.HALF_OPEN:
            s.open_for = min(self._settings.max_open_s, max(s.open_for, self._settings.open_s) * 2)
            s.circuit, s.opened_at, s.probing = Circuit.OPEN, now, False
        elif s.circuit is Circuit.CLOSED and s.failures >= self._settings.failures:
            s.open_for = self._settings.open_s
            s.circuit, s.opened_at = Circuit.OPEN, now

    def refused(self, instance_id: str, backoff_s: float) -> None:
        """It answered 429: busy, not broken. Rank it last for ``backoff_s``."""
        s = self.stats(instance_id)
        s.refused_until = max(s.refused_until, self._clock() + backoff_s)
        s.probing = False

    def abandoned(self, instance_id: str) -> None:
        """A request that ended without a verdict (cancelled hedge, client gone)."""
        s = self.stats(instance_id)
        s.probing = False
