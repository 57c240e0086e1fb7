"""How much a measured time varies: a few quantiles of value / median, and draws from them.

A profile keeps, for prefill and for each decode batch size, the dispersion
of what it measured as a :data:`Spread`: ``(q, ratio)`` pairs from ``q = 0``
(the fastest sample) to ``q = 1`` (the slowest), the ratio being the sample
over the median of its kind. The simulator multiplies its median-based times
by ratios drawn from it (inverse CDF, linear between the stored quantiles),
with its own seeded RNG, so a simulation stays reproducible for a seed.
"""

from __future__ import annotations

import bisect
import itertools
import math
import random
import statistics
from collections.abc import Sequence

__all__ = [
    "LEVELS",
    "Spread",
    "SpreadSampler",
    "merge_spreads",
    "ratios_to_median",
    "spread_of",
]

Spread = list[tuple[float, float]]
# Quantiles a spread stores: both ends, so draws cover the whole measured range.
LEVELS: tuple[float, ...] = (0.0, 0.1, 0.25, 0.5, 0.75, 0.9, 0.95, 0.99, 1.0)


def _quantile(sorted_values: Sequence[float], q: float) -> float:
    """Linear-interpolated quantile of sorted values (numpy's default method)."""
    pos = q * (len(sorted_values) - 1)
    lo = math.floor(pos)
    hi = min(lo + 1, len(sorted_values) - 1)
    return sorted_values[lo] + (sorted_values[hi] - sorted_values[lo]) * (pos - lo)


def spread_of(ratios: Sequence[float], levels: Sequence[float] = LEVELS) -> Spread:
    """The quantiles of ``ratios`` (samples over their median); empty if fewer than 3."""
    if len(ratios) < 3:
        return []
    values = sorted(ratios)
    return [(q, _quantile(values, q)) for q in levels]


def ratios_to_median(groups: Sequence[Sequence[float]]) -> list[float]:
    """Each sample over the median of its group (e.g. TTFTs of one prompt length)."""
    out: list[float] = []
    for group in groups:
        if not group:
            continue
        mid = statistics.median(group)
        if mid > 0:
            out += [v / mid for v in group]
    return out


def merge_spreads(a: Spread, b: Spread) -> Spread:
    """The mean of two spreads measured at the same levels (else the non-empty one)."""
    if not a or not b or [q for q, _ in a] != [q for q, _ in b]:
        return a or b
    return [(q, (x + y) / 2) for (q, x), (_, y) in zip(a, b, strict=True)]


class SpreadSampler:
    """Draws ratios from a spread with a seeded RNG; a spread-less one always answers 1."""

    def __init__(self, spread: Spread, rng: random.Random) -> None:
        self._qs = [q for q, _ in spread]
        self._vs = [v for _, v in spread]
        self._rng = rng
        # The mean ratio: a sum of many draws tends to it (a trapezoid over the CDF).
        self.mean = 1.0
        if len(spread) >= 2:
            pairs = itertools.pairwise(spread)
            self.mean = sum((q1 - q0) * (v0 + v1) / 2 for (q0, v0), (q1, v1) in pairs)

    @property
    def active(self) -> bool:
        return len(self._qs) >= 2

    def draw(self) -> float:
        if not self.active:
            return 1.0
        u = self._rng.random()
        qs, vs = self._qs, self._vs
        i = min(max(bisect.bisect_right(qs, u), 1), len(qs) - 1)
        q0, q1 = qs[i - 1], qs[i]
        frac = (u - q0) / (q1 - q0) if q1 > q0 else 0.0
        return vs[i - 1] + (vs[i] - vs[i - 1]) * frac

    def draw_mean(self, n: int, cap: int = 16) -> float:
        """The mean of ``n`` independent draws: up to ``cap`` are drawn, and their
        deviation from the mean shrunk as ``n`` draws' would be (sqrt(cap / n))."""
        if not self.active or n <= 0:
            return 1.0
        k = min(n, cap)
        mean_k = sum(self.draw() for _ in range(k)) / k
        return max(0.0, self.mean + (mean_k - self.mean) * math.sqrt(k / n))
