from __future__ import annotations

import asyncio

import pytest

from servekit.admission import AdmissionQueue
from servekit.engine.protocol import Priority
from servekit.errors import QueueFull

pytestmark = pytest.mark.anyio


async def test_runs_up_to_slots_then_queues_then_refuses() -> None:
    q = AdmissionQueue(slots=2, max_waiting=1)
    a = await q.acquire()
    b = await q.acquire()
    waiter = asyncio.create_task(q.acquire())
    await asyncio.sleep(0)
    assert (q.running, q.waiting) == (2, 1)
    with pytest.raises(QueueFull) as info:
        await q.acquire()
    assert info.value.retry_after is not None
    assert info.value.retry_after >= 1
    a.release()
    c = await asyncio.wait_for(waiter, 1)
    assert (q.running, q.waiting) == (2, 0)
    b.release()
    c.release()
    c.release()  # idempotent
    assert q.running == 0


async def test_interactive_first_without_starving_batch() -> None:
    q = AdmissionQueue(slots=1, max_waiting=100, batch_every=3)
    holder = await q.acquire()
    order: list[str] = []

    async def worker(name: str, prio: Priority) -> None:
        t = await q.acquire(prio)
        order.append(name)
        await asyncio.sleep(0)
        t.release()

    tasks = [asyncio.create_task(worker(f"b{i}", Priority.BATCH)) for i in range(3)]
    tasks += [asyncio.create_task(worker(f"i{i}", Priority.INTERACTIVE)) for i in range(6)]
    await asyncio.sleep(0)
    holder.release()
    await asyncio.wait_for(asyncio.gather(*tasks), 2)
    # Interactive goes first, yet batch gets every third grant while interactive waits.
    assert order[:3] == ["i0", "i1", "b0"]
    assert order.index("b1") < order.index("i5")
    assert sorted(order) == sorted([f"b{i}" for i in range(3)] + [f"i{i}" for i in range(6)])


async def test_cancelled_waiter_leaves_the_queue() -> None:
    q = AdmissionQueue(slots=1, max_waiting=2)
    holder = await q.acquire()
    waiter = asyncio.create_task(q.acquire())
    await asyncio.sleep(0)
    assert q.waiting == 1
    waiter.cancel()
    with pytest.raises(asyncio.CancelledError):
        await waiter
    assert q.waiting == 0
    holder.release()
    assert q.running == 0
    again = await asyncio.wait_for(q.acquire(), 1)
    again.release()


async def test_resize_lets_waiters_in_at_once() -> None:
    q = AdmissionQueue(slots=1, max_waiting=4)
    held = await q.acquire()
    waiter = asyncio.create_task(q.acquire())
    await asyncio.sleep(0)
    assert q.waiting == 1
    q.resize(2)
    ticket = await asyncio.wait_for(waiter, 1)
    assert (q.running, q.waiting) == (2, 0)
    ticket.release()
    held.release()
