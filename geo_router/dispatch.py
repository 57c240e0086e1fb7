"""The router's use of the one dispatch loop (``servekit.dispatch``).

:func:`first_primed` tries a plan's candidates in order, one
:class:`~geo_router.attempt.Attempt` each, and returns the first to prime
(200 and a first token) through :func:`servekit.dispatch.first_primed`. What
is the router's own is here:

* the order is the plan's, fixed when the request arrived; a
  ``context_length_exceeded`` skips every untried candidate whose window is
  no larger (:func:`larger_window`);
* a hedge is a second attempt started after a delay (the request's own
  predicted P90 TTFT there, ``geo_router.predictor``; until the instance's
  model has learned, its recent P95, or the request's own predicted TTFT
  there when that is longer: :func:`hedge_delay_s`) while the first
  is still waiting; an attempt still racing when the other won is judged as
  failed if it was already past its own first-token deadline (with nobody
  left to try it was not cut, but an instance that keeps missing its own
  deadlines while hedges answer for it is as broken as one that is cut);
  hedges started, won and lost are counted;
* a continuation (``geo_router.routed``) is a re-plan of the extended
  request through this same loop.

The first-token deadline is the attempt's (``geo_router.attempt``); the loop
cuts an attempt at it while anybody is left to try, and the last one waits for
the whole request's timeout.
"""

from __future__ import annotations

import time
from collections.abc import Sequence

from geo_router.attempt import Attempt, Routing
from geo_router.request import RouteRequest
from geo_router.routing_settings import HedgeSettings
from geo_router.scoring import Scored
from geo_router.tracker import Tracker
from servekit import dispatch
from servekit.errors import ContextLengthExceeded, NotReady, RateLimited, ServeError

__all__ = ["first_primed", "hedge_delay_s", "larger_window"]


def hedge_delay_s(hedge: HedgeSettings, tracker: Tracker, cand: Scored) -> float:
    """How long an attempt at ``cand`` may take before a hedge races it: the request's
    predicted P90 there; until the instance's model has learned, the router's own P95
    TTFT there, else the instance's reported P95, else the default, and never less
    than the request's own predicted TTFT there. An instance's short answers say
    nothing of this request's cold prefill: through ``up --netem`` a same-city edge
    chosen for a customer-service prompt (3.5 s predicted, cold) was raced by the
    center at its P95 (~0.9 s) twelve times in a row, each hedge cancelling the
    prefill that would have made the next one quick."""
    delay = cand.ttft_p90_ms
    if delay is None:
        delay = tracker.stats(cand.id).ttft_p95_ms() or cand.state.load.ttft_p95_ms
        if delay is None:
            delay = hedge.default_delay_ms
        delay = max(delay, cand.ttft_ms)
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
    hedges = routing.metrics.hedges
    racing: dispatch.Hedge[Attempt] | None = None
    if hedge and len(plan) > 1:
        settings, tracker = routing.settings.hedge, routing.tracker
        racing = dispatch.Hedge(
            lambda a: hedge_delay_s(settings, tracker, a.cand),
            lambda: hedges.labels("started").inc(),
        )
    winner, hedged = await dispatch.first_primed(
        _Plan(routing, req, plan), hedge=racing, clock=routing.clock
    )
    if hedged:
        hedges.labels("won" if winner.index > 0 else "lost").inc()
    return winner, hedged and winner.index > 0


class _Plan:
    """The plan's candidates in order, one :class:`Attempt` each; after a
    ``context_length_exceeded`` only the untried ones with a larger window."""

    __slots__ = ("_next", "_order", "_req", "_routing", "_waited_s")

    def __init__(self, routing: Routing, req: RouteRequest, plan: Sequence[Scored]) -> None:
        self._routing, self._req = routing, req
        self._order = list(plan)
        self._next = 0
        self._waited_s = 0.0  # what the request had spent when an instance refused it

    def more(self) -> bool:
        return self._next < len(self._order)

    async def next(self, *, hedge: bool) -> Attempt | None:
        index = self._next
        if index >= len(self._order):
            return None
        self._next += 1
        req, cand = self._req, self._order[index]
        return Attempt(self._routing, req, cand, index, hedge=hedge, waited_s=self._waited_s)

    def failed(self, attempt: Attempt, err: ServeError) -> None:
        if isinstance(err, RateLimited):
            # Refused by admission, maybe after queueing for its slot: the next
            # instance counts what the request has spent against its own budget
            # (X-Waited-Ms), or it admits what then answers past it. Other failures
            # are hidden as before: a failover after a hung instance is served.
            self._waited_s = time.perf_counter() - self._req.arrived  # as it was stamped
        if isinstance(err, ContextLengthExceeded):
            # Only untried candidates with a larger window may hold it.
            order, nxt, cand = self._order, self._next, attempt.cand
            self._order = [*order[:nxt], *(c for c in order[nxt:] if larger_window(cand, c))]
