"""The one dispatch loop: the first primed attempt of a try order.

:func:`first_primed` tries a plan's candidates in order, one
:class:`~geo_router.attempt.Attempt` each, and returns the first to prime
(200 and a first token). Everything before the first byte happens in this
one loop:

* an attempt that fails moves on to the next candidate (a non-retryable
  error ends the loop; a ``context_length_exceeded`` skips every candidate
  whose window is no larger);
* an attempt that misses its first-token deadline is cut, while anybody is
  left to try; the last one waits for the whole request's timeout;
* without a hedge, an attempt is awaited in place (a task costs about 0.1 ms
  on the cold caches a request usually meets); with one, attempts are tasks;
* a hedge is a second attempt started after a delay (the request's own
  predicted P90 TTFT there, ``geo_router.predictor``; until the instance's
  model has learned, its recent P95) while the first is still waiting; the
  first to prime wins and the other is abandoned, or judged as failed when it
  was already past its own first-token deadline (with nobody left to try it
  was not cut, but an instance that keeps missing its own deadlines while
  hedges answer for it is as broken as one that is cut);
* a continuation (``geo_router.routed``) is a re-plan of the extended
  request through this same loop.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Sequence

from geo_router.attempt import Attempt, Routing
from geo_router.request import RouteRequest
from geo_router.scoring import Scored
from geo_router.settings import HedgeSettings
from geo_router.tracker import Tracker
from servekit.errors import ContextLengthExceeded, NotReady, ServeError

__all__ = ["first_primed", "hedge_delay_s", "larger_window"]


def hedge_delay_s(hedge: HedgeSettings, tracker: Tracker, cand: Scored) -> float:
    """How long an attempt at ``cand`` may take before a hedge races it: the request's
    predicted P90 there; until the instance's model has learned, the router's own P95
    TTFT there, else the instance's reported P95, else the default."""
    delay = cand.ttft_p90_ms
    if delay is None:
        delay = tracker.stats(cand.id).ttft_p95_ms() or cand.state.load.ttft_p95_ms
    if delay is None:
        delay = hedge.default_delay_ms
    return max(hedge.min_delay_ms, delay) / 1000.0


def larger_window(failed: Scored, cand: Scored) -> bool:
    """May ``cand`` hold what overflowed ``failed``'s context window?"""
    if failed.window is not None and cand.window is not None:
        return cand.window > failed.window
    return failed.tier == "edge" and cand.tier == "center"


async def first_primed(
    routing: Routing, req: RouteRequest, plan: Sequence[Scored], *, hedge: bool
) -> tuple[Attempt, bool]:
    """The first attempt of ``plan`` to prime, and whether it is a winning hedge.

    The caller books the winner (:meth:`~geo_router.attempt.Attempt.won`) once its
    first bytes are on their way to the client: the predictor's update and the
    prefix record are off the path to the first token. Raises the last attempt's
    error when none primes (at once for an error no other instance would answer
    differently)."""
    if not plan:
        raise NotReady("no healthy upstream can serve this request", retry_after=1)
    settings, metrics = routing.settings, routing.metrics
    hedge = hedge and len(plan) > 1
    order, nxt, hedged = list(plan), 0, False
    racing: dict[asyncio.Task[None], Attempt] = {}
    last_err: ServeError | None = None

    def launch() -> None:
        nonlocal nxt
        attempt = Attempt(routing, req, order[nxt], nxt, hedge=hedged)
        racing[asyncio.create_task(attempt.prime())] = attempt
        nxt += 1

    def judge(attempt: Attempt, exc: BaseException) -> None:
        nonlocal order, last_err
        last_err = attempt.failed(exc)  # raises when nobody else may try
        if isinstance(last_err, ContextLengthExceeded):
            # Only untried candidates with a larger window may hold it.
            cand = attempt.cand
            order = [*order[:nxt], *(c for c in order[nxt:] if larger_window(cand, c))]

    try:
        while True:
            if not racing:
                if nxt >= len(order):
                    assert last_err is not None
                    raise last_err
                if not hedge:
                    # Nothing can race it: awaited in place, its deadline as a timeout
                    # while somebody is left (no task to schedule on the hot path).
                    attempt = Attempt(routing, req, order[nxt], nxt)
                    nxt += 1
                    left = nxt < len(order)
                    try:
                        async with asyncio.timeout(
                            attempt.deadline - time.perf_counter() if left else None
                        ) as timer:
                            await attempt.prime()
                    except Exception as failure:
                        if timer.expired():
                            last_err = attempt.missed()
                        else:
                            judge(attempt, failure)
                        continue
                    except BaseException:  # cancelled: the client went away
                        await attempt.abandon()
                        raise
                    return attempt, False
                launch()
            timers: list[float] = []
            if nxt < len(order):  # somebody is left: deadlines and the hedge apply
                timers += [a.deadline for a in racing.values()]
                if hedge and not hedged and len(racing) == 1:
                    (only,) = racing.values()
                    timers.append(
                        only.started + hedge_delay_s(settings.hedge, routing.tracker, only.cand)
                    )
            timeout = None if not timers else max(0.0, min(timers) - time.perf_counter())
            done, _ = await asyncio.wait(
                racing, timeout=timeout, return_when=asyncio.FIRST_COMPLETED
            )
            if not done:
                now = time.perf_counter()
                late = [(t, a) for t, a in racing.items() if now >= a.deadline]
                for task, attempt in late:  # missed its first token: move on
                    del racing[task]
                    await _cancelled(task)
                    last_err = attempt.missed()
                if not late:
                    hedged = True
                    metrics.hedges.labels("started").inc()
                    launch()
                continue
            winner: Attempt | None = None
            for task in done:
                attempt = racing.pop(task)
                exc = task.exception()
                if exc is not None:
                    judge(attempt, exc)
                elif winner is None:
                    winner = attempt
                else:  # a tie: keep the first, drop the other
                    await attempt.abandon()
            if winner is not None:
                if hedged:
                    metrics.hedges.labels("won" if winner.index > 0 else "lost").inc()
                now = time.perf_counter()
                for task, attempt in list(racing.items()):
                    if now >= attempt.deadline:  # it missed its own deadline: a failure
                        del racing[task]
                        await _cancelled(task)
                        attempt.missed()
                return winner, hedged and winner.index > 0
    finally:
        for task, attempt in racing.items():
            await _cancelled(task)
            await attempt.abandon()


async def _cancelled(task: asyncio.Task[None]) -> None:
    task.cancel()
    with contextlib.suppress(BaseException):
        await task
