"""Bounded admission with two priority classes.

At most ``slots`` requests run at once; up to ``max_waiting`` more wait.
Interactive requests go first, but one grant in every ``batch_every`` goes
to a waiting batch request, so batch work is never starved. A full queue is
refused at once with :class:`~servekit.errors.QueueFull` and a Retry-After
estimated from the recent service time. A waiter that is cancelled (its
client went away) leaves the queue without taking a slot.

With a TTFT budget (``ttft_budget_ms``) the queue also refuses at once, with
the same 429, a request whose *predicted TTFT* exceeds the budget, instead of
letting it queue for seconds; a router then places it elsewhere. The
prediction for a newcomer is its wait before its own prefill begins
(:mod:`servekit.slot_wait`: the slot it gets, the sequences beside it, the
prompts read before its own, from what the engine reports through
:meth:`AdmissionQueue.observe` and what each ticket was expected to hold)
plus

- its own prefill (``own_prefill_ms``, given by the caller): the prompt
  tokens the engine does not hold cached, at its measured prefill rate. A
  queue that left it out admitted a cold 500-token prompt at a predicted
  wait of zero, and that request still took seconds to its first token.
  The engine prices it where it can tell what its slots hold
  (``servekit.engine.protocol.uncached_tokens``); otherwise the router's
  estimate for that instance (``X-Prefill-Tokens``); otherwise it is left
  out. It is priced from the request, not from the engine's recent TTFTs:
  those would feed back on themselves (once refusals stop admitting
  requests, a high median would never come down).

So the budget is the TTFT the instance promises, queueing and prefill both.
A prompt whose prefill alone would spend most of it cannot meet it on any
instance like this one, yet it must be served some time (a client sent a
28 s document to a center that was never idle, and got 429s). So on an
*idle* instance (nothing running, nothing waiting) its own prefill counts
up to ``OWN_PREFILL_SHARE`` of the budget and it is taken; the requests
after it see its prefill in the backlog. On a busy instance its own prefill
counts whole: under 32 streams of overload, 489-913-token cold prompts
admitted beside others (their prefill charged at 3/4 of the budget) were
the admitted P99, 5-10 s against a 1.5 s budget. Refused, such a prompt is
told to come back when the instance is predicted to be idle (every slot
held and waited for freed, :meth:`AdmissionQueue.drained_ms`); a prompt
that fits the budget is told to come back when the wait ahead of it has
shrunk enough.

A request that queued for a slot is priced again when it gets one
(:meth:`AdmissionQueue.recheck`): the cache it was priced against may be gone
by then (another request took the slot that held its system prompt). Under
overload two prompts priced at 1-2 tokens to prefill (their system prompt
held) found 360-495 after queueing 1.1-1.7 s, took 3-7 s to their first
token, and stalled every sequence beside them for as long (the slowest
admitted requests of that run, queued behind them, waited 6-8 s). If its own
prefill has grown and the time it waited, the backlog ahead of it and that
prefill now exceed the budget, it is refused after all.

The prediction is a typical TTFT; the budget is what admitted requests
should meet. With ``ttft_quantile`` a newcomer that would queue also carries
a margin, how late the queue's recent predictions ran at that quantile
(:mod:`servekit.lateness`), and until it is measured such a newcomer is
refused.

A router that falls back to another instance after such a refusal says what
the request had spent by then (``spent_ms``, ``X-Waited-Ms``), and the next
instance counts it against its own budget: the one that refused does not
count on it being tried elsewhere, and otherwise the next admitted it as
fresh. In one 32-stream overload run the slowest answers (2.5-4.3 s) were
such fallbacks, refused after queueing 1.1-1.6 s and admitted again.
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from dataclasses import dataclass, field

from servekit.engine.protocol import Priority
from servekit.errors import QueueFull
from servekit.lateness import Lateness
from servekit.settings import AdmissionSettings
from servekit.slot_wait import newcomer_wait_ms, slot_frees_s

__all__ = ["OWN_PREFILL_SHARE", "AdmissionQueue", "Ticket", "over_ttft_budget"]

OWN_PREFILL_SHARE = 0.75  # of the budget, at most, charged for a request's own prefill


def over_ttft_budget(
    wait_ms: float, own_prefill_ms: float, budget_ms: float, *, idle: bool
) -> bool:
    """Would a request miss a TTFT budget: its wait and its own prefill, the prefill
    counted whole, or on an ``idle`` instance up to ``OWN_PREFILL_SHARE`` of the
    budget (see above)? A router judging whether an instance would refuse asks
    the same."""
    own = max(0.0, own_prefill_ms)
    charged = min(own, OWN_PREFILL_SHARE * budget_ms) if idle else own
    return wait_ms + charged > budget_ms


@dataclass(eq=False)
class Ticket:
    """A held slot; release it exactly once (``release`` is idempotent)."""

    queue: AdmissionQueue
    priority: Priority
    enqueued_at: float
    admitted_at: float = 0.0
    hold_s: float | None = None  # how long its own prompt and answer should hold a slot
    predicted_ms: float | None = None  # its TTFT as predicted when admitted (with a budget)
    _released: bool = field(default=False, repr=False)

    @property
    def queue_time(self) -> float:
        return self.admitted_at - self.enqueued_at

    def release(self) -> None:
        if not self._released:
            self._released = True
            self.queue._release(self)


class AdmissionQueue:
    def __init__(
        self,
        slots: int,
        max_waiting: int,
        *,
        batch_every: int = 4,
        ttft_budget_ms: float | None = None,
        ttft_quantile: float | None = None,
    ) -> None:
        if slots < 1:
            raise ValueError("slots must be at least 1")
        self.slots = slots
        self.max_waiting = max_waiting
        self.batch_every = max(1, batch_every)
        self.ttft_budget_ms = ttft_budget_ms
        self.lateness = Lateness(ttft_quantile)
        self.busy_ms_per_seq: float | None = None
        self.prefill_backlog_ms: float | None = None
        self.slot_release_ms: tuple[float, ...] | None = None
        self.shed = 0  # requests refused on the budget
        self._held: dict[Ticket, float] = {}  # running tickets -> admitted at
        self._running = 0
        self._waiters: dict[Priority, deque[tuple[Ticket, asyncio.Future[None]]]] = {
            p: deque() for p in Priority
        }
        self._grants = 0
        self._service_s: float | None = None  # moving average of how long a slot is held

    @classmethod
    def from_settings(cls, slots: int, settings: AdmissionSettings) -> AdmissionQueue:
        """The queue an ``admission:`` block describes, in front of ``slots`` slots."""
        return cls(
            slots,
            settings.max_waiting,
            batch_every=settings.batch_every,
            ttft_budget_ms=settings.ttft_budget_ms,
            ttft_quantile=settings.ttft_budget_quantile,
        )

    @property
    def running(self) -> int:
        return self._running

    @property
    def waiting(self) -> int:
        return sum(len(q) for q in self._waiters.values())

    def resize(self, slots: int) -> None:
        """Change how many run at once (replicas came or went); waiters are let in at once."""
        self.slots = max(1, slots)
        self._grant_next()

    def retry_after(self) -> float:
        """Seconds until a slot is likely free for a newcomer."""
        backlog = self.waiting + 1
        return max(1.0, (self._service_s or 1.0) * backlog / self.slots)

    def observe(
        self,
        busy_ms_per_seq: float | None,
        prefill_backlog_ms: float | None = None,
        slot_release_ms: tuple[float, ...] | None = None,
    ) -> None:
        """The engine's latest slowdown per running sequence, prefill backlog, and
        when its running sequences free their slots (ms, ascending; ``None`` when
        it cannot tell)."""
        self.busy_ms_per_seq = busy_ms_per_seq
        self.prefill_backlog_ms = prefill_backlog_ms
        self.slot_release_ms = slot_release_ms

    @property
    def idle(self) -> bool:
        """Nothing running and nothing waiting: a prompt too long for the budget is
        taken now (see above)."""
        return self._running == 0 and self.waiting == 0

    def budget_now_ms(self) -> float | None:
        """The budget a prediction alone must meet now: the budget less the margin
        while a newcomer would queue (what a router judging whether this instance
        would refuse compares with)."""
        budget = self.ttft_budget_ms
        return None if budget is None else budget - self._margin_now()

    def _queues(self) -> bool:
        """A newcomer would wait for a slot."""
        return self._running >= self.slots or self.waiting > 0

    def _lateness_unknown(self) -> bool:
        """A newcomer would queue and the margin is not measured yet: refused."""
        return self._queues() and self.lateness.unknown

    def _margin_now(self) -> float:
        # Only a newcomer that would queue carries it (servekit.lateness).
        return self.lateness.margin_ms() if self._queues() else 0.0

    def first_token(self, ticket: Ticket, ttft_ms: float) -> None:
        """An admitted request got its first token ``ttft_ms`` after it arrived."""
        self.lateness.record(ticket.predicted_ms, ttft_ms)

    def _predicted(self, wait: float | None, own_prefill_ms: float) -> float | None:
        """A request's predicted TTFT when admitted, where the budget judged it
        whole: not a prompt taken by the idle rule at a share of its prefill."""
        budget = self.ttft_budget_ms
        if budget is None or wait is None or own_prefill_ms > OWN_PREFILL_SHARE * budget:
            return None
        return wait + max(0.0, own_prefill_ms)

    def predicted_wait_ms(self, now: float | None = None) -> float | None:
        """Predicted wait of a request arriving now, before its own prefill
        (:mod:`servekit.slot_wait`); ``None`` when it would queue and no hold time is
        measured yet. A request's predicted TTFT is this plus its ``own_prefill_ms``."""
        now = time.monotonic() if now is None else now
        ahead = self.waiting
        return newcomer_wait_ms(
            slots=self.slots,
            running=self._running,
            ahead=ahead,
            frees_s=self._frees(ahead, now) if self._queues() else None,
            backlog_ms=self.prefill_backlog_ms or 0.0,
            busy_ms_per_seq=self.busy_ms_per_seq,
        )

    def drained_ms(self, now: float | None = None) -> float | None:
        """Predicted milliseconds until every slot held and every request waiting
        has finished, so that the queue is idle again; ``None`` when that needs
        the mean hold and none is measured yet."""
        now = time.monotonic() if now is None else now
        frees = self._frees(self.waiting, now)
        return None if frees is None else max(frees) * 1000.0

    def _frees(self, ahead: int, now: float) -> list[float] | None:
        """:func:`~servekit.slot_wait.slot_frees_s` of this queue's slots: the engine's
        releases for the oldest tickets it runs, the others' own or the mean hold."""
        engine = self.slot_release_ms
        held = sorted(self._held.items(), key=lambda item: item[1])  # the oldest first
        known = [] if engine is None else [ms / 1000.0 for ms in engine[: len(held)]]
        # The youngest tickets the engine does not count yet (admitted, not yet
        # running in it), or all of them when it cannot tell.
        guessed = [(t.hold_s, now - at) for t, at in held[len(known) :]]
        return slot_frees_s(
            slots=self.slots,
            engine_s=known,
            guessed=guessed,
            ahead=ahead,
            mean_hold_s=self._service_s,
        )

    def _over(self, wait: float | None, own_prefill_ms: float, spent_ms: float = 0.0) -> bool:
        """Past the budget (see :func:`over_ttft_budget`) with ``spent_ms`` spent before
        it came here (see above), or a wait unknown."""
        if self.ttft_budget_ms is None:
            return False
        if wait is None or self._lateness_unknown():
            return True
        total = spent_ms + wait + self._margin_now()
        return over_ttft_budget(total, own_prefill_ms, self.ttft_budget_ms, idle=self.idle)

    def _check_budget(self, own_prefill_ms: float, spent_ms: float = 0.0) -> float | None:
        """The predicted wait of a request the budget allows; :class:`QueueFull` if not."""
        budget = self.ttft_budget_ms
        if budget is None:
            return None
        wait = self.predicted_wait_ms()
        if not self._over(wait, own_prefill_ms, spent_ms):
            return wait
        self.shed += 1
        if wait is None or self._lateness_unknown():
            told = "no request has finished yet to tell how long they take"
            if wait is not None:
                told = "too few requests have had a first token to tell how late it runs"
            raise QueueFull(
                f"server cannot start this request within its TTFT budget (every slot is "
                f"busy and {told}); retry later",
                retry_after=self.retry_after(),
            )
        why = (
            "it is taken only when the server is idle" if own_prefill_ms > budget else "retry later"
        )
        spent = f"{spent_ms:.0f} ms spent before + " if spent_ms > 0 else ""
        margin = self._margin_now()
        late = f" + margin {margin:.0f} ms" if margin > 0 else ""
        raise QueueFull(
            f"server cannot start this request within its TTFT budget ({spent}predicted "
            f"wait {wait:.0f} ms + own prefill {own_prefill_ms:.0f} ms{late} > {budget:.0f} ms); "
            f"{why}",
            # A retry starts afresh: what it spent before does not shrink by waiting.
            retry_after=self._retry_s(wait, own_prefill_ms, budget),
        )

    def _retry_s(self, wait_ms: float, own_prefill_ms: float, budget_ms: float) -> float:
        """When to come back, refused with ``wait_ms`` ahead (see above)."""
        if own_prefill_ms > budget_ms:
            # Only an idle instance takes it: come back when this one should be.
            drained = self.drained_ms()
            return self.retry_after() if drained is None else max(1.0, drained / 1000.0)
        # Its own prefill does not shrink by waiting: the wait must.
        return max(1.0, (wait_ms + own_prefill_ms + self._margin_now() - budget_ms) / 1000.0)

    def recheck(self, ticket: Ticket, priced_ms: float, own_prefill_ms: float) -> None:
        """Judge a request again once it has its slot (see above): it was admitted
        with ``priced_ms`` of own prefill and now has ``own_prefill_ms``. Raises
        :class:`QueueFull`, with its slot handed on, when that has grown and its
        time waited, the prefill backlog ahead and its own prefill exceed the budget."""
        budget = self.ttft_budget_ms
        if budget is None or own_prefill_ms <= priced_ms:
            return
        waited_ms = ticket.queue_time * 1000.0
        backlog = self.prefill_backlog_ms or 0.0
        if waited_ms + backlog + own_prefill_ms <= budget:
            return
        self.shed += 1
        ticket.admitted_at = 0.0  # held for no work: not a hold time
        ticket.release()
        raise QueueFull(
            f"server cannot start this request within its TTFT budget (waited "
            f"{waited_ms:.0f} ms for a slot, and the cache it was priced against is gone: "
            f"backlog {backlog:.0f} ms + own prefill {own_prefill_ms:.0f} ms); retry later",
            retry_after=self._retry_s(backlog, own_prefill_ms, budget),
        )

    def _admit(self, ticket: Ticket, now: float) -> Ticket:
        ticket.admitted_at = now
        self._held[ticket] = now
        return ticket

    def try_acquire(
        self,
        priority: Priority = Priority.INTERACTIVE,
        own_prefill_ms: float = 0.0,
        hold_ms: float | None = None,
        spent_ms: float = 0.0,
    ) -> Ticket | None:
        """A slot at once if one is free, nobody waits and the budget allows; else None.
        ``hold_ms``: how long the engine expects the request to hold it, if it can tell;
        ``spent_ms``: what it spent before it came here (a router's refused attempts)."""
        if self._running < self.slots and self.waiting == 0:
            wait = self.predicted_wait_ms() if self.ttft_budget_ms is not None else None
            if self._over(wait, own_prefill_ms, spent_ms):
                return None  # acquire() refuses it, with the figures
            now = time.monotonic()
            self._running += 1
            ticket = Ticket(self, priority, now, hold_s=_seconds(hold_ms))
            ticket.predicted_ms = self._predicted(wait, own_prefill_ms)
            return self._admit(ticket, now)
        return None

    async def acquire(
        self,
        priority: Priority = Priority.INTERACTIVE,
        own_prefill_ms: float = 0.0,
        hold_ms: float | None = None,
        spent_ms: float = 0.0,
    ) -> Ticket:
        """A slot, waiting for it if need be; :class:`QueueFull` at once when the queue
        is full or (with a budget) ``spent_ms``, the wait and ``own_prefill_ms`` exceed it."""
        wait = self._check_budget(own_prefill_ms, spent_ms)
        now = time.monotonic()
        ticket = Ticket(self, priority, now, hold_s=_seconds(hold_ms))
        ticket.predicted_ms = self._predicted(wait, own_prefill_ms)
        if self._running < self.slots and self.waiting == 0:
            self._running += 1
            return self._admit(ticket, now)
        if self.waiting >= self.max_waiting:
            raise QueueFull(
                f"server is at capacity ({self._running} running, {self.waiting} waiting); "
                "retry later",
                retry_after=self.retry_after(),
            )
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        entry = (ticket, fut)
        self._waiters[priority].append(entry)
        try:
            await fut
        except BaseException:
            if fut.done() and not fut.cancelled():
                # Granted just as we were cancelled: hand the slot on.
                self._admit(ticket, time.monotonic())
                ticket.release()
            else:
                self._waiters[priority].remove(entry)
            raise
        return self._admit(ticket, time.monotonic())

    def _release(self, ticket: Ticket) -> None:
        if ticket.admitted_at:
            held = time.monotonic() - ticket.admitted_at
            ema = self._service_s
            self._service_s = held if ema is None else 0.8 * ema + 0.2 * held
        self._held.pop(ticket, None)
        self._running -= 1
        self._grant_next()

    def _grant_next(self) -> None:
        while self._running < self.slots:
            entry = self._pick()
            if entry is None:
                return
            ticket, fut = entry
            if fut.done():
                continue
            self._held[ticket] = time.monotonic()
            self._running += 1
            self._grants += 1
            fut.set_result(None)

    def _pick(self) -> tuple[Ticket, asyncio.Future[None]] | None:
        inter = self._waiters[Priority.INTERACTIVE]
        batch = self._waiters[Priority.BATCH]
        batch_turn = batch and (not inter or (self._grants + 1) % self.batch_every == 0)
        if batch_turn:
            return batch.popleft()
        if inter:
            return inter.popleft()
        return None


def _seconds(ms: float | None) -> float | None:
    return None if ms is None else ms / 1000.0
