"""Speeds measured in passing on another server's stream."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest

from servekit.engine.protocol import Finish, GenerationEvent, TextDelta
from servekit.engine.rates import RateTracker, measured

pytestmark = pytest.mark.anyio


async def _stream(
    closed: list[bool], *, prefill_s: float, tokens: int
) -> AsyncIterator[GenerationEvent]:
    try:
        await asyncio.sleep(prefill_s)
        for _ in range(tokens):
            yield TextDelta("x", 1)
            await asyncio.sleep(0.01)
        yield Finish("length", 120, tokens, 20)
    finally:
        closed.append(True)


async def test_records_ttft_prefill_and_decode_of_a_stream() -> None:
    rates = RateTracker()
    closed: list[bool] = []
    events = [e async for e in measured(_stream(closed, prefill_s=0.1, tokens=5), rates)]
    assert isinstance(events[-1], Finish)
    assert len(events) == 6  # passed through unchanged
    report = rates.report()
    assert report.ttft_p50_ms is not None
    assert 100 <= report.ttft_p50_ms < 1000
    # 100 uncached prompt tokens (120 less 20 cached) over the TTFT.
    assert report.prefill_tokens_per_s == pytest.approx(100 / (report.ttft_p50_ms / 1000))
    assert report.decode_tokens_per_s is not None
    assert 0 < report.decode_tokens_per_s <= 100  # 4 tokens over at least 40 ms
    assert closed == [True]


async def test_closing_early_closes_the_stream_and_records_no_rates() -> None:
    rates = RateTracker()
    closed: list[bool] = []
    stream = measured(_stream(closed, prefill_s=0.0, tokens=50), rates)
    async for event in stream:
        assert isinstance(event, TextDelta)
        break
    await stream.aclose()  # type: ignore[attr-defined]
    assert closed == [True]
    assert rates.report().ttft_p50_ms is not None  # the first token came
    assert rates.prefill_tps is None  # no Finish: no prompt count to rate
