"""Stopping a poller: the round under way finishes; one that hangs is cut."""

from __future__ import annotations

import asyncio

import pytest

from servekit.winddown import pause, wind_down

pytestmark = pytest.mark.anyio


async def _poller(stopping: asyncio.Event, round_s: float, rounds: list[str]) -> None:
    while not await pause(stopping, 0.01):
        rounds.append("started")
        await asyncio.sleep(round_s)
        rounds.append("finished")


async def test_the_round_under_way_finishes() -> None:
    stopping, rounds = asyncio.Event(), []
    task = asyncio.create_task(_poller(stopping, 0.2, rounds))
    while not rounds:  # noqa: ASYNC110 (the poller's own record)
        await asyncio.sleep(0.005)
    await wind_down(task, stopping)
    assert rounds == ["started", "finished"]  # finished, and no round after it
    assert task.done()
    assert not task.cancelled()


async def test_a_round_that_hangs_is_cut_after_the_grace() -> None:
    stopping, rounds = asyncio.Event(), []
    task = asyncio.create_task(_poller(stopping, 3600.0, rounds))
    while not rounds:  # noqa: ASYNC110 (the poller's own record)
        await asyncio.sleep(0.005)
    await wind_down(task, stopping, grace_s=0.05)
    assert rounds == ["started"]
    assert task.cancelled()
