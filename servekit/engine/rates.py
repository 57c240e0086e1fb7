"""Recent speed figures an engine reports in its load report.

A window of recent TTFTs (quantiles on demand) and moving averages of the
decode and prefill rates; both llama.cpp engines read quantiles the same way.
An engine that only sees another server's stream (a local ``vllm serve``, a
central gateway's replicas) measures it in passing with :func:`measured`.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import AsyncIterator

from servekit.engine.protocol import Finish, GenerationEvent, LoadReport, TextDelta

__all__ = ["RateTracker", "measured", "percentile"]


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

    def report(self) -> LoadReport:
        """These figures as a load report; its other fields are the caller's to set."""
        return LoadReport(
            ttft_p50_ms=self.ttft_quantile(0.5),
            ttft_p95_ms=self.ttft_quantile(0.95),
            decode_tokens_per_s=self.decode_tps,
            prefill_tokens_per_s=self.prefill_tps,
        )


async def measured(
    events: AsyncIterator[GenerationEvent], rates: RateTracker
) -> AsyncIterator[GenerationEvent]:
    """``events`` passed through unchanged, their speeds recorded in ``rates``:
    the TTFT, the prefill rate (uncached prompt tokens over the TTFT, the
    server's fixed cost per request included) and the decode rate after the
    first token. Closing this stream closes ``events``."""
    sent = time.monotonic()
    first: float | None = None
    try:
        async for event in events:
            if first is None and isinstance(event, TextDelta):
                first = time.monotonic()
                rates.ttft(first - sent)
            elif isinstance(event, Finish) and first is not None:
                rates.prefill(event.prompt_tokens - event.cached_prompt_tokens, first - sent)
                rates.decode(event.completion_tokens - 1, time.monotonic() - first)
            yield event
    finally:
        close = getattr(events, "aclose", None)
        if close is not None:
            await close()
