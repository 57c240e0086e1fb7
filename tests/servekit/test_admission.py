from __future__ import annotations

import asyncio
import time

import pytest

from servekit.admission import OWN_PREFILL_SHARE, AdmissionQueue
from servekit.engine.protocol import Priority
from servekit.errors import QueueFull
from servekit.lateness import LATE_MIN

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


async def test_a_ttft_budget_refuses_at_once_what_would_wait_too_long() -> None:
    q = AdmissionQueue(slots=1, max_waiting=8, ttft_budget_ms=400.0)
    (await q.acquire()).release()
    q._service_s = 1.0  # a request holds its slot 1 s on average
    holder = await q.acquire()  # a newcomer would wait ~1 s
    wait = q.predicted_wait_ms()
    assert wait is not None
    assert 900 < wait <= 1000
    with pytest.raises(QueueFull) as info:
        await q.acquire()
    assert "TTFT budget" in info.value.message
    assert info.value.retry_after is not None
    assert info.value.retry_after >= 1
    assert (q.running, q.waiting, q.shed) == (1, 0, 1)
    holder.release()
    # Once the slot is free the newcomer starts at once: no wait to predict.
    assert q.predicted_wait_ms() == 0.0
    (await q.acquire()).release()


async def test_a_cold_queue_refuses_what_would_wait_for_an_unmeasured_hold() -> None:
    """Before any request has finished, nobody knows how long a slot is held: a
    request that would queue is refused, not queued behind a guess."""
    q = AdmissionQueue(slots=2, max_waiting=8, ttft_budget_ms=1000.0)
    first, second = await q.acquire(), await q.acquire()  # free slots: no wait to predict
    assert q.predicted_wait_ms() is None
    with pytest.raises(QueueFull, match="no request has finished yet") as info:
        await q.acquire()
    assert info.value.retry_after == 1
    first.release()  # held for microseconds: now the hold time is known
    third = await q.acquire()
    assert q.predicted_wait_ms() is not None
    # Without a budget the queue waits as it always did.
    plain = AdmissionQueue(slots=1, max_waiting=8)
    held = await plain.acquire()
    waiter = asyncio.create_task(plain.acquire())
    await asyncio.sleep(0)
    assert plain.waiting == 1
    held.release()
    (await waiter).release()
    for t in (second, third):
        t.release()


async def test_the_slot_wait_counts_the_requests_ahead_and_what_running_ones_have_left() -> None:
    q = AdmissionQueue(slots=2, max_waiting=8)
    q._service_s = 2.0  # a request holds its slot 2 s on average
    now = time.monotonic()
    a, b = await q.acquire(), await q.acquire()
    q._held[a] = now - 1.5  # 0.5 s left
    q._held[b] = now - 0.5  # 1.5 s left
    assert q.predicted_wait_ms(now) == pytest.approx(500.0)
    waiters = [asyncio.create_task(q.acquire()) for _ in range(3)]
    await asyncio.sleep(0)
    # Three ahead: it takes the fourth release, slot b's second: 1.5 s + one mean hold.
    assert q.predicted_wait_ms(now) == pytest.approx(1500.0 + 2000.0)
    for w in waiters:
        w.cancel()
    await asyncio.gather(*waiters, return_exceptions=True)
    a.release()
    b.release()


async def test_the_busy_slowdown_of_running_sequences_counts_against_the_budget() -> None:
    q = AdmissionQueue(slots=4, max_waiting=8, ttft_budget_ms=150.0)
    q.observe(60.0)  # the engine measured 60 ms per running sequence
    first = q.try_acquire()
    second = await q.acquire()
    assert first is not None
    assert q.predicted_wait_ms() == pytest.approx(120.0)
    third = await q.acquire()
    assert q.predicted_wait_ms() == pytest.approx(180.0)  # a free slot, but three beside it
    assert q.try_acquire() is None
    with pytest.raises(QueueFull):
        await q.acquire()
    for t in (first, second, third):
        t.release()


async def test_the_engines_prefill_backlog_counts_against_the_budget() -> None:
    """A free slot is no promise when the engine still has seconds of prompts to prefill."""
    q = AdmissionQueue(slots=4, max_waiting=8, ttft_budget_ms=1000.0)
    q.observe(50.0, prefill_backlog_ms=1500.0)
    assert q.predicted_wait_ms() == pytest.approx(1500.0)
    assert q.try_acquire() is None
    with pytest.raises(QueueFull, match="predicted wait 1500 ms"):
        await q.acquire()
    q.observe(50.0, prefill_backlog_ms=0.0)
    ticket = await q.acquire()
    ticket.release()


async def test_the_requests_own_prefill_counts_against_the_budget() -> None:
    """Wait plus own prefill is held against the budget."""
    q = AdmissionQueue(slots=4, max_waiting=8, ttft_budget_ms=1000.0)
    running = await q.acquire(own_prefill_ms=100.0)
    q.observe(None, prefill_backlog_ms=400.0)  # the wait now: 400 ms of prompts ahead
    short = q.try_acquire(own_prefill_ms=500.0)  # 900 ms
    assert short is not None
    short.release()
    assert q.try_acquire(own_prefill_ms=700.0) is None  # 1100 ms
    with pytest.raises(QueueFull, match="predicted wait 400 ms \\+ own prefill 700 ms") as info:
        await q.acquire(own_prefill_ms=700.0)
    assert info.value.retry_after == 1.0  # 100 ms over: the wait must shrink that much
    running.release()


async def test_a_prompt_too_long_for_the_budget_is_taken_only_by_an_idle_queue() -> None:
    """Its prefill alone spends the budget: an idle queue takes it, charged
    ``OWN_PREFILL_SHARE`` of the budget (it must be served some time); a busy one
    refuses it, even with little wait ahead (once it was charged the same share
    there, and such prompts were the admitted P99 under overload), and says to
    come back when the queue should be idle."""
    assert OWN_PREFILL_SHARE < 1.0
    q = AdmissionQueue(slots=4, max_waiting=8, ttft_budget_ms=1000.0)
    running = await q.acquire(own_prefill_ms=5000.0)  # idle: 750 ms charged, taken
    # It is being read; the engine says its slot frees in 6 s.
    q.observe(None, prefill_backlog_ms=200.0, slot_release_ms=(6000.0,))
    with pytest.raises(QueueFull, match="taken only when the server is idle") as info:
        await q.acquire(own_prefill_ms=5000.0)  # 200 + 750 would have passed
    assert info.value.retry_after == pytest.approx(6.0)
    assert q.try_acquire(own_prefill_ms=1200.0) is None
    short = q.try_acquire(own_prefill_ms=500.0)  # a question still fits beside it
    assert short is not None
    short.release()
    running.release()
    q.observe(None, prefill_backlog_ms=0.0, slot_release_ms=())
    (await q.acquire(own_prefill_ms=5000.0)).release()  # idle again: taken


async def test_a_queued_newcomer_waits_for_the_later_of_its_slot_and_the_backlog() -> None:
    """Both slots held, 900 ms of prompts still to read, the first slot frees in
    1.2 s (its sequence's own prefill included): by then the backlog ahead is
    read. The sum (2.1 s) over-predicted and refused what would have made it."""
    q = AdmissionQueue(slots=2, max_waiting=8, ttft_budget_ms=2000.0)
    q._service_s = 1.0
    a, b = await q.acquire(), await q.acquire()
    q.observe(None, prefill_backlog_ms=900.0, slot_release_ms=(1200.0, 3000.0))
    assert q.predicted_wait_ms() == pytest.approx(1200.0)
    waiter = asyncio.create_task(q.acquire(own_prefill_ms=600.0))  # 1.8 s: it may queue
    await asyncio.sleep(0)
    assert q.waiting == 1
    q.observe(None, prefill_backlog_ms=2500.0, slot_release_ms=(1200.0, 3000.0))
    assert q.predicted_wait_ms() == pytest.approx(2500.0)  # the backlog outlasts the slot
    a.release()
    (await waiter).release()
    b.release()


async def test_a_refusing_queue_recovers_once_its_slots_free() -> None:
    """Refusals must not feed back: nothing about them keeps the next request out."""
    q = AdmissionQueue(slots=1, max_waiting=8, ttft_budget_ms=100.0)
    held = await q.acquire()
    for _ in range(5):
        with pytest.raises(QueueFull):
            await q.acquire()
    held.release()
    (await q.acquire()).release()


async def test_the_slot_wait_prices_what_the_engines_running_sequences_have_left() -> None:
    """A slot held by a long prompt frees when its work is done, not after the mean
    hold: one slot holds a document with 3 s of prefill and answer left, the other
    a question 0.2 s from its end. The mean hold (1 s, from recent short requests)
    would have both free within 0.5 s."""
    q = AdmissionQueue(slots=2, max_waiting=8)
    q._service_s = 1.0
    now = time.monotonic()
    long, short = await q.acquire(), await q.acquire()
    q._held[long] = q._held[short] = now - 0.5
    q.observe(None, slot_release_ms=(200.0, 3000.0))
    assert q.predicted_wait_ms(now) == pytest.approx(200.0)  # the question's slot
    waiters = [asyncio.create_task(q.acquire()) for _ in range(3)]
    await asyncio.sleep(0)
    # Three ahead take the question's slot in turn (0.2, 1.2, 2.2 s; each holds it
    # the mean 1 s, free again at 3.2 s): the newcomer gets the document's at 3 s.
    # The mean hold alone predicted 0.5 s + 1 s.
    assert q.predicted_wait_ms(now) == pytest.approx(3000.0)
    q.observe(None, slot_release_ms=None)  # an engine that cannot tell: the mean hold
    assert q.predicted_wait_ms(now) == pytest.approx(1500.0)
    for w in waiters:
        w.cancel()
    await asyncio.gather(*waiters, return_exceptions=True)
    long.release()
    short.release()


async def test_a_ticket_the_engine_does_not_run_yet_is_priced_at_the_mean_hold() -> None:
    q = AdmissionQueue(slots=2, max_waiting=8)
    now = time.monotonic()
    old, young = await q.acquire(), await q.acquire()
    q._held[old], q._held[young] = now - 2.0, now - 0.25
    q.observe(None, slot_release_ms=(4000.0,))  # the engine runs the old one only
    assert q.predicted_wait_ms(now) is None  # the young one's hold is not measured yet
    q._service_s = 1.0
    assert q.predicted_wait_ms(now) == pytest.approx(750.0)
    old.release()
    young.release()


async def test_a_ticket_the_engine_does_not_run_yet_is_priced_at_its_own_hold() -> None:
    """Admitted in an opening burst, before the engine placed it: the engine's price
    of its own prompt and answer beside the others, not the mean hold a single
    warm-up stream measured (a third of what the burst's slots were held)."""
    q = AdmissionQueue(slots=2, max_waiting=8)
    q._service_s = 1.0
    now = time.monotonic()
    old = await q.acquire()
    young = await q.acquire(hold_ms=3000.0)
    q._held[old], q._held[young] = now - 2.0, now - 0.25
    q.observe(None, slot_release_ms=(4000.0,))  # the engine runs the old one only
    assert q.predicted_wait_ms(now) == pytest.approx(2750.0)
    # With no mean hold measured, its own hold still prices it.
    q._service_s = None
    assert q.predicted_wait_ms(now) == pytest.approx(2750.0)
    old.release()
    young.release()


async def test_what_a_request_spent_before_it_came_counts_against_the_budget() -> None:
    """Refused elsewhere after queueing 1.4 s, a request that would take 200 ms here
    would answer past the budget: refused, with a Retry-After of a fresh start."""
    q = AdmissionQueue(slots=2, max_waiting=8, ttft_budget_ms=1500.0)
    with pytest.raises(QueueFull, match="1400 ms spent before") as info:
        await q.acquire(own_prefill_ms=200.0, spent_ms=1400.0)
    assert info.value.retry_after == 1.0
    assert q.try_acquire(own_prefill_ms=200.0, spent_ms=1400.0) is None
    ticket = await q.acquire(own_prefill_ms=200.0, spent_ms=1200.0)  # it still fits
    ticket.release()


async def test_a_request_that_queued_is_priced_again_when_it_gets_its_slot() -> None:
    """Priced at 10 ms of own prefill (its system prompt held), it queued; by the
    time its slot freed the prompt was gone from the cache: 3 s now. Refused, its
    slot handed to the next waiter; a price that did not grow, or still fits, stays."""
    q = AdmissionQueue(slots=1, max_waiting=8, ttft_budget_ms=1500.0)
    q._service_s = 0.5
    holder = await q.acquire()
    queued = asyncio.create_task(q.acquire(own_prefill_ms=10.0))
    behind = asyncio.create_task(q.acquire())
    await asyncio.sleep(0.01)
    holder.release()
    ticket = await queued
    assert ticket.queue_time > 0
    q.recheck(ticket, 10.0, 10.0)  # the same price: kept
    q.recheck(ticket, 10.0, 900.0)  # grown, but it still fits
    hold = q._service_s
    with pytest.raises(QueueFull, match="the cache it was priced against is gone") as info:
        q.recheck(ticket, 10.0, 3000.0)
    assert info.value.retry_after is not None
    assert info.value.retry_after >= 1.0
    assert q._service_s == hold  # held for no work: not a hold time
    (await asyncio.wait_for(behind, 1)).release()
    assert (q.running, q.waiting) == (0, 0)


async def test_a_budget_at_a_quantile_carries_how_late_recent_predictions_were() -> None:
    """Admitted requests got their first tokens 0-720 ms later than predicted: at
    the 0.9 quantile a newcomer that would queue carries 720 ms, so a 1,000 ms
    wait and 300 ms of own prefill miss a 1,500 ms budget; the prediction alone
    meets it. One that finds a slot free carries nothing; before any lateness is
    measured, nobody queues."""
    q = AdmissionQueue(slots=2, max_waiting=8, ttft_budget_ms=1500.0, ttft_quantile=0.9)
    plain = AdmissionQueue(slots=2, max_waiting=8, ttft_budget_ms=1500.0)
    q._service_s = plain._service_s = 1.0  # a hold measured: a queued wait is known
    held = [await q.acquire(), await q.acquire()]
    with pytest.raises(QueueFull, match="too few requests have had a first token"):
        await q.acquire()  # it would queue with no margin measured
    for ticket in held:
        ticket.release()
    for i, late in enumerate(range(0, 800, 80)):
        ticket = await q.acquire(own_prefill_ms=100.0)
        q.first_token(ticket, 100.0 + late)
        ticket.release()
        if i + 1 < LATE_MIN:
            assert q.lateness.margin_ms() == 0.0  # too few seen to tell
    # Taken by the idle rule, not judged whole: its lateness teaches nothing.
    ticket = await q.acquire(own_prefill_ms=3000.0)
    q.first_token(ticket, 9000.0)
    ticket.release()
    assert q.lateness.margin_ms() == pytest.approx(720.0)
    assert q.budget_now_ms() == pytest.approx(1500.0)  # a slot is free
    q._service_s = 1.0  # the quick requests above shortened the mean hold
    for queue in (q, plain):
        running = [await queue.acquire(own_prefill_ms=1200.0), await queue.acquire()]
        if queue is q:
            assert queue.budget_now_ms() == pytest.approx(780.0)
            with pytest.raises(QueueFull, match="margin 720 ms") as info:
                await queue.acquire(own_prefill_ms=300.0)
            assert info.value.retry_after == pytest.approx(1.0, abs=0.1)
        else:
            waiter = asyncio.ensure_future(queue.acquire(own_prefill_ms=300.0))
            await asyncio.sleep(0)
            assert queue.waiting == 1  # it queues for the first slot to free
            running.pop().release()
            (await waiter).release()
        for ticket in running:
            ticket.release()
