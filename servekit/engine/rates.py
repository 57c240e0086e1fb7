"""Recent speed figures an engine reports in its load report.

A window of recent TTFTs (quantiles on demand) and moving averages of the
decode and prefill rates; both llama.cpp engines read quantiles the same way.
"""

from __future__ import annotations

from collections import deque

__all__ = ["RateTracker", "percentile"]


def percentile(sorted_values: list[float], q: float) -> float | None:
    """The nearest-rank ``q`` quantile of already sorted values, or None if empty."""
    if not sorted_values:
        return None
    k = min(len(sorted_values) - 1, max(0, round(q * (len(sorted_values) - 1))))
    return sorted_values[k]


def _ema(old: float | None, new: float, alpha: float = 0.2) -> float:
    return new if old is None else (1 - alpha) * old + alpha * new


class RateTracker:
    """Recent TTFTs (a window) and decode/prefill rates (moving averages)."""

    def __init__(self, window: int = 128) -> None:
        self._ttft: deque[float] = deque(maxlen=window)
        self.decode_tps: float | None = None
        self.prefill_tps: float | None = None

    def ttft(self, seconds: float) -> None:
        self._ttft.append(seconds * 1000.0)

    def decode(self, tokens: int, seconds: float) -> None:
        if tokens > 0 and seconds > 0:
            self.decode_tps = _ema(self.decode_tps, tokens / seconds)

    def prefill(self, tokens: int, seconds: float) -> None:
        if tokens > 0 and seconds > 0:
            self.prefill_tps = _ema(self.prefill_tps, tokens / seconds)

    def ttft_quantile(self, q: float) -> float | None:
        return percentile(sorted(self._ttft), q)
