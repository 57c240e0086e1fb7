"""The one dispatch loop: the first attempt of a try order to prime.

A service that can send a request to several upstreams (the router's
instances, the central gateway's replicas) commits to its client only once
one of them has *primed*: answered and produced its first token or event.
Everything before that happens in :func:`first_primed`:

* attempts come one at a time from a :class:`Candidates` supply, which owns
  the order and hears of every failure: the router's is its plan, fixed when
  the request arrived and pruned to larger windows after a
  ``context_length_exceeded``; the central gateway's is its balancer over the
  replicas healthy now, waiting a moment for one to come back;
* an attempt that fails judges itself (:meth:`Attempt.failed`, which raises
  when no other upstream would answer differently) and the next candidate is
  tried; when the supply has nobody left, the last error is raised;
* an attempt that misses its first-token deadline is cut while the supply has
  somebody left; the last one waits (its own whole-request bound applies);
* without hedging an attempt is awaited in place (a task costs about 0.1 ms on
  the cold caches a request usually meets); with a :class:`Hedge`, attempts
  are tasks and a second one starts once the first has taken its delay; the
  first to prime wins and the other is abandoned, or judged as having missed
  its deadline when it was already past it.

Time is read from one clock, ``clock`` (``time.perf_counter`` unless given):
an attempt's ``started`` and ``deadline`` are readings of it. The waits are
the event loop's, given as durations, so a virtual event loop with its own
``time`` passed as ``clock`` would drive the whole loop.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Generic, Protocol, TypeVar

from servekit.errors import NotReady, ServeError

__all__ = ["Attempt", "Candidates", "Clock", "Hedge", "first_primed"]

Clock = Callable[[], float]


class Attempt(Protocol):
    """One try at one upstream, as the loop sees it; it holds its upstream's slot
    from creation until exactly one verdict (:meth:`failed`, :meth:`missed`,
    :meth:`abandon`, or the caller's once it streamed)."""

    @property
    def started(self) -> float:
        """When it was made (a ``clock`` reading)."""
        ...

    @property
    def deadline(self) -> float:
        """Its first token by then, or it is cut while somebody is left (``math.inf``:
        never cut)."""
        ...

    async def prime(self) -> None:
        """Send the request and read up to the first token; raise what went wrong."""
        ...

    def failed(self, exc: BaseException) -> ServeError:
        """It never primed: its error, raised when nobody else may try, returned when
        the next candidate may."""
        ...

    def missed(self) -> ServeError:
        """It was cut at its deadline: judged as failed with a timeout."""
        ...

    async def abandon(self) -> None:
        """Ended without a verdict (a lost hedge, a client that left)."""
        ...


A = TypeVar("A", bound=Attempt)


class Candidates(Protocol[A]):
    """Where the attempts come from, in the order the caller's policy wants."""

    def more(self) -> bool:
        """Is anybody left to try after the attempts made so far?"""
        ...

    async def next(self, *, hedge: bool) -> A | None:
        """The next attempt (``hedge``: made once a hedge was started), or ``None``
        when nobody is left; it may wait for a candidate, or raise its own error."""
        ...

    def failed(self, attempt: A, err: ServeError) -> None:
        """``attempt`` failed with ``err`` and somebody else may try."""
        ...


@dataclass(slots=True)
class Hedge(Generic[A]):
    """Race a second attempt against a slow first one."""

    delay_s: Callable[[A], float]  # how long an attempt may take before a hedge races it
    started: Callable[[], None] = lambda: None  # told when a hedge starts (a metric)


async def first_primed(
    candidates: Candidates[A], *, hedge: Hedge[A] | None = None, clock: Clock = time.perf_counter
) -> tuple[A, bool]:
    """The first attempt to prime, and whether a hedge was started on the way.

    The caller owns the winner's verdict. Raises the last attempt's error when
    none primes (at once for an error no other upstream would answer differently)."""
    if hedge is None:
        return await _in_turn(candidates, clock), False
    return await _racing(candidates, hedge, clock)


async def _in_turn(candidates: Candidates[A], clock: Clock) -> A:
    """One attempt at a time, awaited in place, its deadline a timeout while somebody
    is left (no task to schedule on the hot path)."""
    last_err: ServeError | None = None
    while True:
        attempt = await candidates.next(hedge=False)
        if attempt is None:
            raise _exhausted(last_err)
        cut = attempt.deadline if candidates.more() else math.inf
        try:
            async with asyncio.timeout(_until(cut, clock)) as timer:
                await attempt.prime()
        except Exception as failure:
            last_err = attempt.missed() if timer.expired() else attempt.failed(failure)
            candidates.failed(attempt, last_err)
            continue
        except BaseException:  # cancelled: the client went away
            await attempt.abandon()
            raise
        return attempt


async def _racing(candidates: Candidates[A], hedge: Hedge[A], clock: Clock) -> tuple[A, bool]:
    """Attempts as tasks, so that a hedge can race a slow first one."""
    racing: dict[asyncio.Task[None], A] = {}
    last_err: ServeError | None = None
    hedged = False

    async def launch() -> bool:
        attempt = await candidates.next(hedge=hedged)
        if attempt is not None:
            racing[asyncio.create_task(attempt.prime())] = attempt
        return attempt is not None

    try:
        while True:
            if not racing and not await launch():
                raise _exhausted(last_err)
            due, hedge_at = math.inf, math.inf
            if candidates.more():  # somebody is left: deadlines and the hedge apply
                due = min(a.deadline for a in racing.values())
                if not hedged and len(racing) == 1:
                    (only,) = racing.values()
                    hedge_at = only.started + hedge.delay_s(only)
            done, _ = await asyncio.wait(
                racing,
                timeout=_until(min(due, hedge_at), clock),
                return_when=asyncio.FIRST_COMPLETED,
            )
            if not done:
                now = clock()
                late = [(t, a) for t, a in racing.items() if now >= a.deadline]
                for task, attempt in late:  # missed its first token: move on
                    del racing[task]
                    await _cancelled(task)
                    last_err = attempt.missed()
                    candidates.failed(attempt, last_err)
                if not late and now >= hedge_at:
                    hedged = True
                    hedge.started()
                    await launch()
                continue
            winner: A | None = None
            for task in done:
                attempt = racing.pop(task)
                exc = task.exception()
                if exc is not None:
                    last_err = attempt.failed(exc)  # raises when nobody else may try
                    candidates.failed(attempt, last_err)
                elif winner is None:
                    winner = attempt
                else:  # a tie: keep the first, drop the other
                    await attempt.abandon()
            if winner is not None:
                now = clock()
                for task, attempt in list(racing.items()):
                    # Past its own deadline with nobody left to cut it for: still a miss.
                    if now >= attempt.deadline:
                        del racing[task]
                        await _cancelled(task)
                        attempt.missed()
                return winner, hedged
    finally:
        for task, attempt in racing.items():
            await _cancelled(task)
            await attempt.abandon()


def _until(when: float, clock: Clock) -> float | None:
    """A timeout until ``when`` (``None``: no timeout)."""
    return None if when == math.inf else max(0.0, when - clock())


def _exhausted(last_err: ServeError | None) -> ServeError:
    return last_err if last_err is not None else NotReady("nobody can serve this", retry_after=1)


async def _cancelled(task: asyncio.Task[None]) -> None:
    task.cancel()
    with contextlib.suppress(BaseException):
        await task
