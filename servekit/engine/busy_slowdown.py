"""How much each running sequence adds to a new request's TTFT, whatever its prompt.

A batching engine admits a prompt while others decode, but not for free: its
prefill steps carry the decoders' tokens, it waits for the step in flight,
and for earlier prompts still prefilling first-come first-served. The router
prices that per sequence running (``busy_ms_per_seq`` in the load report), so
the engine measures it from its own admissions rather than modelling it from
step timings: the measured figure includes all of the above.

A prompt's length must not count as slowdown: on an idle engine a long prompt
takes hundreds of ms longer than a short one, and the router already
estimates prefill from the prompt. So admissions are compared with a
*reference curve*, the TTFT by prompt tokens prefilled of the least busy
admissions, best those that found the engine idle:

1. The reference: admissions with the fewest others running, taken level by
   level from the lowest (idle ones first) until there are :data:`MIN_REF`;
   their mean running count is ``r_ref`` (0 when idle ones suffice). Idle
   admissions are kept apart (the last :data:`IDLE_WINDOW`) so a busy spell
   does not push them out; on an engine that is never idle the least busy of
   the last :data:`BUSY_WINDOW` others serve.
2. The curve: the reference admissions sorted by prompt tokens and cut into up
   to :data:`MAX_POINTS` groups of equal count; each group gives one point
   (median tokens, median TTFT). Between points the curve is linear, beyond
   the ends it follows the end segment (slope at least 0); a single point
   scales with the tokens. Prefill is not linear in the prompt (longer
   contexts cost more per token), hence measured points, not one rate.
3. Every busier admission (running ``r`` above the reference's levels) gives
   ``(TTFT - curve at its tokens) / (r - r_ref)``.
4. The figure is the median of those, clipped at 0; ``None`` until there are
   :data:`MIN_REF` reference and :data:`MIN_BUSY` busier admissions.

A request's TTFT counts from its arrival when it found a slot free (it waited
for the step in flight, part of being busy), from its slot when it queued for
one (the router prices waiting for a slot apart).

The median, because one admission stalled behind a long prompt should not
set the price for all (the router predicts a typical TTFT, not its tail).
The slowdown is taken as linear in the running count, as the router uses it.
"""

from __future__ import annotations

import bisect
from collections import deque
from statistics import median

__all__ = ["BusySlowdown", "ReferenceCurve"]

IDLE_WINDOW = 128
BUSY_WINDOW = 256
MIN_REF = 4
MIN_BUSY = 8
MAX_POINTS = 8


class ReferenceCurve:
    """TTFT (seconds) by prompt tokens prefilled, from (tokens, seconds) samples."""

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
        self._idle: deque[tuple[int, int, float]] = deque(maxlen=IDLE_WINDOW)
        self._busy: deque[tuple[int, int, float]] = deque(maxlen=BUSY_WINDOW)
        self._fitted: float | None = None
        self._stale = False
        # Reported until measured: a simulated engine starting from a real one's report.
        self.prior: float | None = None

    def record(self, running: int, prefilled: int, seconds: float) -> None:
        """One admission: ``running`` others at its start, ``prefilled`` prompt tokens
        computed, ``seconds`` to its first token."""
        sample = (max(0, running), prefilled, seconds)
        (self._idle if running <= 0 else self._busy).append(sample)
        self._stale = True

    def ms_per_seq(self) -> float | None:
        """The module docstring's figure; refitted only after new samples (a fleet
        simulation asks far more often than its instances admit)."""
        if self._stale:
            self._fitted = self._fit()
            self._stale = False
        return self.prior if self._fitted is None else self._fitted

    def _fit(self) -> float | None:
        samples = sorted([*self._idle, *self._busy])  # by running count first
        if len(samples) < MIN_REF + MIN_BUSY:
            return None
        # The reference: whole running levels from the lowest, at least MIN_REF samples.
        level = samples[MIN_REF - 1][0]
        cut = bisect.bisect_right(samples, (level, float("inf"), float("inf")))
        reference, busier = samples[:cut], samples[cut:]
        if len(busier) < MIN_BUSY:
            return None
        r_ref = sum(r for r, _, _ in reference) / len(reference)
        curve = ReferenceCurve([(n, t) for _, n, t in reference])
        per_seq = [(t - curve.at(n)) / (r - r_ref) for r, n, t in busier]
        return max(0.0, median(per_seq)) * 1000.0
