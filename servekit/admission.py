"""Bounded admission with two priority classes.

At most ``slots`` requests run at once; up to ``max_waiting`` more wait.
Interactive requests go first, but one grant in every ``batch_every`` goes
to a waiting batch request, so batch work is never starved. A full queue is
refused at once with :class:`~servekit.errors.QueueFull` and a Retry-After
estimated from the recent service time. A waiter that is cancelled (its
client went away) leaves the queue without taking a slot.
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from dataclasses import dataclass, field

from servekit.engine.protocol import Priority
from servekit.errors import QueueFull

__all__ = ["AdmissionQueue", "Ticket"]


@dataclass(eq=False)
class Ticket:
    """A held slot; release it exactly once (``release`` is idempotent)."""

    queue: AdmissionQueue
    priority: Priority
    enqueued_at: float
    admitted_at: float = 0.0
    _released: bool = field(default=False, repr=False)

    @property
    def queue_time(self) -> float:
        return self.admitted_at - self.enqueued_at

    def release(self) -> None:
        if not self._released:
            self._released = True
            self.queue._release(self)


class AdmissionQueue:
    def __init__(self, slots: int, max_waiting: int, *, batch_every: int = 4) -> None:
        if slots < 1:
            raise ValueError("slots must be at least 1")
        self.slots = slots
        self.max_waiting = max_waiting
        self.batch_every = max(1, batch_every)
        self._running = 0
        self._waiters: dict[Priority, deque[tuple[Ticket, asyncio.Future[None]]]] = {
            p: deque() for p in Priority
        }
        self._grants = 0
        self._service_s = 1.0  # moving average of how long a slot is held

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
        return max(1.0, self._service_s * backlog / self.slots)

    def try_acquire(self, priority: Priority = Priority.INTERACTIVE) -> Ticket | None:
        """A slot at once if one is free and nobody waits; else None (no waiting)."""
        if self._running < self.slots and self.waiting == 0:
            now = time.monotonic()
            self._running += 1
            return Ticket(self, priority, now, admitted_at=now)
        return None

    async def acquire(self, priority: Priority = Priority.INTERACTIVE) -> Ticket:
        now = time.monotonic()
        ticket = Ticket(self, priority, now)
        if self._running < self.slots and self.waiting == 0:
            self._running += 1
            ticket.admitted_at = now
            return ticket
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
                ticket.admitted_at = time.monotonic()
                ticket.release()
            else:
                self._waiters[priority].remove(entry)
            raise
        ticket.admitted_at = time.monotonic()
        return ticket

    def _release(self, ticket: Ticket) -> None:
        if ticket.admitted_at:
            held = time.monotonic() - ticket.admitted_at
            self._service_s = 0.8 * self._service_s + 0.2 * held
        self._running -= 1
        self._grant_next()

    def _grant_next(self) -> None:
        while self._running < self.slots:
            entry = self._pick()
            if entry is None:
                return
            _ticket, fut = entry
            if fut.done():
                continue
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
