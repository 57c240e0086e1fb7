"""The simulator's virtual-time asyncio loop: asyncio's waits, without waiting."""

from __future__ import annotations

import asyncio
import math

import pytest

from hybrid_llm.fleet.sim.events import EventLoop
from hybrid_llm.fleet.sim.virtual_loop import VirtualLoop


class CountingLoop(VirtualLoop):
    """Counts the waits asyncio asked for, and how long each would have been."""

    def __init__(self) -> None:
        super().__init__()
        self.waits: list[float] = []

    def _advance(self, timeout: float | None) -> None:
        if timeout:
            self.waits.append(timeout)
        super()._advance(timeout)


def test_a_minute_of_sleeps_and_timeouts_passes_without_a_real_wait() -> None:
    loop = CountingLoop()
    ticks: list[float] = []
    cut_at: list[float] = []

    async def ticking() -> None:
        for _ in range(60):
            await asyncio.sleep(1.0)
            ticks.append(loop.time())

    async def hung() -> None:
        try:
            async with asyncio.timeout(30.5):
                await asyncio.Event().wait()  # nothing ever sets it
        except TimeoutError:
            cut_at.append(loop.time())

    async def both() -> None:
        await asyncio.gather(ticking(), hung())

    loop.run_until_complete(both())
    assert ticks == [float(s) for s in range(1, 61)]
    assert cut_at == [30.5]
    assert loop.time() == 60.0
    # Every wait asyncio asked its selector for was a jump of the virtual clock: 61 of
    # them (each second and the timeout), adding up to the minute. No real sleep is
    # possible: the loop has no selector that could block.
    assert len(loop.waits) == 61
    assert sum(loop.waits) == pytest.approx(60.0)
    loop.close()


def test_timers_due_together_run_in_the_order_they_were_scheduled() -> None:
    loop = VirtualLoop()
    order: list[int] = []
    for i in range(200):
        loop.call_at(5.0 if i % 2 else 3.0, order.append, i)
    loop.until = 10.0
    loop.run_forever()
    assert order == [*range(0, 200, 2), *range(1, 200, 2)]
    assert loop.time() == 5.0


def test_a_run_stops_before_the_bound_and_resumes_where_it_stopped() -> None:
    events = EventLoop()
    seen: list[float] = []
    for when in (1.0, 2.0, 7.0):
        events.at(when, lambda: seen.append(events.now))
    events.run(until=5.0)
    assert (seen, events.now) == ([1.0, 2.0], 2.0)  # the clock stays at the last event
    events.run()
    assert (seen, events.now, events.processed) == ([1.0, 2.0, 7.0], 7.0, 3)


def test_an_error_in_a_callback_or_a_task_ends_the_run() -> None:
    events = EventLoop()

    def broken() -> None:
        raise ValueError("in a callback")

    events.at(1.0, broken)
    events.at(2.0, lambda: None)
    with pytest.raises(ValueError, match="in a callback"):
        events.run()
    assert events.now == 1.0

    async def failing() -> None:
        await asyncio.sleep(3.0)
        raise KeyError("in a task")

    events = EventLoop()
    events.spawn(failing())
    with pytest.raises(KeyError):
        events.run()
    assert events.now == 3.0


def test_waiting_on_nothing_that_can_happen_stops_the_loop() -> None:
    loop = VirtualLoop()
    with pytest.raises(RuntimeError, match="before Future completed"):
        loop.run_until_complete(asyncio.Event().wait())
    assert loop.time() == 0.0
    assert loop.until == math.inf
