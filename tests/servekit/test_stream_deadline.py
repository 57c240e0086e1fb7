"""The stream deadline helper: what it bounds and what it leaves alone."""

from __future__ import annotations

import asyncio
import time

import pytest

from servekit.errors import StreamDeadlineExceeded
from servekit.stream_deadline import stream_deadline

pytestmark = pytest.mark.anyio


async def test_a_block_still_running_at_the_deadline_is_ended() -> None:
    began = time.perf_counter()
    with pytest.raises(StreamDeadlineExceeded) as raised:
        async with stream_deadline(began, 0.2):
            await asyncio.sleep(5)
    assert 0.2 <= time.perf_counter() - began < 1.0
    assert raised.value.code == "stream_deadline_exceeded"
    assert raised.value.body()["error"]["type"] == "timeout"


async def test_the_deadline_counts_from_arrival() -> None:
    arrived = time.perf_counter() - 10  # the request came 10 s ago
    began = time.perf_counter()
    with pytest.raises(StreamDeadlineExceeded):
        async with stream_deadline(arrived, 5.0):
            await asyncio.sleep(5)
    assert time.perf_counter() - began < 0.5


async def test_no_deadline_and_a_finished_block_pass_untouched() -> None:
    async with stream_deadline(time.perf_counter(), None):
        await asyncio.sleep(0.05)
    async with stream_deadline(time.perf_counter(), 5.0):
        await asyncio.sleep(0.01)


async def test_the_blocks_own_timeout_and_a_cancellation_are_not_the_deadline() -> None:
    with pytest.raises(TimeoutError):
        async with stream_deadline(time.perf_counter(), 5.0):
            async with asyncio.timeout(0.01):
                await asyncio.sleep(1)

    async def bounded() -> None:
        async with stream_deadline(time.perf_counter(), 5.0):
            await asyncio.sleep(5)

    task = asyncio.create_task(bounded())
    await asyncio.sleep(0.01)
    task.cancel()  # a client that went away
    with pytest.raises(asyncio.CancelledError):
        await task
