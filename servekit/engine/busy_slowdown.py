"""How much each running sequence adds to a new request's TTFT, whatever its prompt.

A batching engine admits a prompt while others decode, but not for free: its
prefill steps carry the decoders' tokens, it waits for the step in flight,
and for earlier prompts still prefilling first-come first-served. The router
prices that per sequence running (``busy_ms_per_seq`` in the load report), so
the engine measures it from its own admissions rather than modelling it from
step timings: the measured figure includes all of the above.

A prompt's length must not count as slowdown: on an idle engine a long prompt
takes hundreds of ms longer than a short one, and the router already
estimates prefill from the prompt. So each admission is compared with the
engine's *idle curve*, the TTFT of admissions that found no other sequence
running, by prompt tokens prefilled:

1. The idle curve: idle admissions (the last :data:`IDLE_WINDOW`, kept apart
   so a busy spell does not push them out) sorted by prompt tokens and cut
   into up to :data:`MAX_POINTS` groups of equal count; each group gives one
   point (median tokens, median TTFT). Between points the curve is linear,
   beyond the ends it follows the end segment (slope at least 0); a single
   point scales with the tokens. Prefill is not linear in the prompt (longer
   contexts cost more per token), hence measured points, not one rate.
2. Each admission that found ``running >= 1`` others (the last
   :data:`BUSY_WINDOW`) gives ``(TTFT - idle curve at its tokens) / running``.
3. The figure is the median of those, clipped at 0; ``None`` until
   :data:`MIN_IDLE` idle and :data:`MIN_BUSY` busy admissions were seen.

A request's TTFT counts from its arrival when it found a slot free (it waited
for the step in flight, part of being busy), from its slot when it queued for
one (the router prices waiting for a slot apart).

The median, because one admission stalled behind a long prompt should not
set the price for all (the router predicts a typical TTFT, not its tail).
"""

from __future__ import annotations

import bisect
from collections import deque
from statistics import median

__all__ = ["BUSY_WINDOW", "BusySlowdown", "IdleCurve"]

IDLE_WINDOW = 128
BUSY_WINDOW = 256
MIN_IDLE = 3
MIN_BUSY = 8
MAX_POINTS = 8


class IdleCurve:
    """Idle TTFT (seconds) by prompt tokens prefilled, from idle admissions."""

    def __init__(self, samples: list[tuple[int, float]]) -> None:
        ordered = sorted(samples)
        groups = max(1, min(MAX_POINTS, len(ordered) // 4))
        points: dict[float, list[float]] = {}
        for g in range(groups):
            part = ordered[g * len(ordered) // groups : (g + 1) * len(ordered) // groups]
            points.setdefault(median(n for n, _ in part), []).append(median(t for _, t in part))
        self.xs = sorted(points)
        self.ys = [sum(points[x]) / len(points[x]) for x in self.xs]

    def at(self, tokens: int) -> float:
        xs, ys = self.xs, self.ys
        if len(xs) == 1:
            return ys[0] * tokens / xs[0] if xs[0] > 0 else ys[0]
        i = min(max(bisect.bisect_left(xs, tokens), 1), len(xs) - 1)
        slope = max(0.0, (ys[i] - ys[i - 1]) / (xs[i] - xs[i - 1]))
        return max(0.0, ys[i - 1] + slope * (tokens - xs[i - 1]))


class BusySlowdown:
    """Admission samples and the fitted figure (not thread-safe: the owner locks)."""

    def __init__(self) -> None:
        self._idle: deque[tuple[int, float]] = deque(maxlen=IDLE_WINDOW)
        self._busy: deque[tuple[int, int, float]] = deque(maxlen=BUSY_WINDOW)
        self._fitted: float | None = None
        self._stale = False
        # Reported until measured: a simulated engine starting from a real one's report.
        self.prior: float | None = None

    def record(self, running: int, prefilled: int, seconds: float) -> None:
        """One admission: ``running`` others at its start, ``prefilled`` prompt tokens
        computed, ``seconds`` to its first token."""
        if running <= 0:
            self._idle.append((prefilled, seconds))
        else:
            self._busy.append((running, prefilled, seconds))
        self._stale = True

    def ms_per_seq(self) -> float | None:
        """The module docstring's figure; refitted only after new samples (a fleet
        simulation asks far more often than its instances admit)."""
        if self._stale:
            self._fitted = self._fit()
            self._stale = False
        return self.prior if self._fitted is None else self._fitted

    def _fit(self) -> float | None:
        if len(self._idle) < MIN_IDLE or len(self._busy) < MIN_BUSY:
            return None
        curve = IdleCurve(list(self._idle))
        per_seq = [(t - curve.at(n)) / running for running, n, t in self._busy]
        return max(0.0, median(per_seq)) * 1000.0
