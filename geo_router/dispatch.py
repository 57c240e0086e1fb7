"""Dispatch: failover before the first byte, hedging, and finding a continuation.

:meth:`Dispatcher.open` tries candidates in the planner's order until one is
primed (200 and a first token), optionally racing a hedge when the current
attempt is slower than its instance's recent P95 TTFT; losers are cancelled.
:meth:`Dispatcher.resume` opens the continuation of a stream that broke off
(``geo_router.relay`` streams the bytes).

Two refusals move on without counting as failures: a 429 (the instance is
busy: it ranks last for ``shed_backoff_s``, its circuit stays closed) and a
``context_length_exceeded`` 400 (the request is too long *there*: only
candidates with a larger context window are tried after it; when none is
left, the 400 reaches the client). The primed instance's prefix index entry
is updated with what it was sent.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from geo_router.continuation import Kind, StreamState, continuation_body
from geo_router.http_client import UpstreamPool
from geo_router.metrics import RouterMetrics
from geo_router.planner import Decision, Planner
from geo_router.prefix_index import PrefixIndex
from geo_router.region import ResolvedRegion
from geo_router.scoring import Scored
from geo_router.settings import HedgeSettings, RoutingSettings
from geo_router.tracker import Tracker
from geo_router.upstream import (
    Primed,
    open_stream,
    translate_error,
)
from servekit.errors import (
    ContextLengthExceeded,
    NotReady,
    RateLimited,
    ServeError,
    UpstreamTimeout,
    UpstreamUnavailable,
)
from servekit.peers import PeerCredentials
from servekit.registry.protocol import InstanceInfo
from servekit.sse import DONE_FRAME

__all__ = ["Dispatcher", "Opened", "RouteRequest", "hedge_delay_s", "larger_window"]


@dataclass(slots=True)
class RouteRequest:
    body: dict[str, Any]  # the validated client body
    kind: Kind
    path: str
    region: ResolvedRegion
    sticky: str
    headers: dict[str, str]  # sent upstream (priority, request id)
    arrived: float  # perf_counter at arrival
    upstream_body: dict[str, Any] = field(default_factory=dict)


@dataclass(slots=True)
class Opened:
    primed: Primed
    cand: Scored
    reason: str


def hedge_delay_s(hedge: HedgeSettings, tracker: Tracker, cand: Scored) -> float:
    """How long an attempt at ``cand`` may take before a hedge races it: the router's
    own P95 TTFT there, else the instance's reported P95, else the default."""
    p95 = tracker.stats(cand.id).ttft_p95_ms() or cand.state.load.ttft_p95_ms
    delay = p95 if p95 is not None else hedge.default_delay_ms
    return max(hedge.min_delay_ms, delay) / 1000.0


def larger_window(failed: Scored, cand: Scored) -> bool:
    """May ``cand`` hold what overflowed ``failed``'s context window?"""
    if failed.window is not None and cand.window is not None:
        return cand.window > failed.window
    return failed.tier == "edge" and cand.tier == "center"


def _cause(err: ServeError) -> str:
    if isinstance(err, UpstreamTimeout):
        return "timeout"
    if isinstance(err, UpstreamUnavailable):
        return "unavailable"
    if isinstance(err, RateLimited):
        return "rate_limited"
    return "error"


def _after_overflow(cands: Sequence[Scored], nxt: int, failed: Scored) -> list[Scored]:
    """The try order after ``failed`` overflowed: untried ones with a larger window only."""
    return [*cands[:nxt], *(c for c in cands[nxt:] if larger_window(failed, c))]


class Dispatcher:
    def __init__(
        self,
        pool: UpstreamPool,
        planner: Planner,
        tracker: Tracker,
        metrics: RouterMetrics,
        routing: RoutingSettings,
        prefixes: PrefixIndex | None = None,
        peers: Callable[[InstanceInfo], PeerCredentials | None] = lambda _info: None,
    ) -> None:
        self._pool = pool
        self._peer = peers  # the token and TLS trust for an instance
        self._planner = planner
        self.tracker = tracker
        self.metrics = metrics
        self._routing = routing
        self._prefixes = prefixes

    async def open(self, req: RouteRequest, decision: Decision) -> Opened:
        cands = decision.candidates[: self._routing.max_attempts]
        # A warming attempt is a cold start on purpose: a hedge would cancel it.
        hedge = self._routing.hedge.enabled and not (cands and cands[0].warming)
        primed, cand, index, hedged = await self._race(req, cands, req.upstream_body, hedge)
        if hedged:
            reason = "hedge"
        elif index > 0:
            reason = "fallback"
        else:
            reason = decision.reason(cand)
        if self._prefixes is not None and cand.prefix is not None:
            load = cand.state.load
            kv = load.capacity * load.max_context_tokens if load.max_context_tokens else None
            self._prefixes.record(cand.id, cand.prefix, kv)
        return Opened(primed, cand, reason)  # the relay counts the decision once bytes flow

    def _payload(self, body: dict[str, Any], cand: Scored) -> bytes:
        out = dict(body)
        out["model"] = cand.state.info.model
        if cand.trim is not None and "messages" in out:
            out["messages"] = cand.trim.messages
        return json.dumps(out, ensure_ascii=False, separators=(",", ":")).encode()

    def _hedge_delay_s(self, cand: Scored) -> float:
        return hedge_delay_s(self._routing.hedge, self.tracker, cand)

    async def _race(
        self, req: RouteRequest, cands: Sequence[Scored], body: dict[str, Any], hedge: bool
    ) -> tuple[Primed, Scored, int, bool]:
        """The first candidate to prime, trying them in order; hedged when slow."""
        if not cands:
            raise NotReady("no healthy upstream can serve this request", retry_after=1)
        if not hedge or len(cands) < 2:
            primed, cand, index = await self._in_turn(req, cands, body)
            return primed, cand, index, False
        tasks: dict[asyncio.Task[Primed], tuple[int, Scored]] = {}
        started: dict[asyncio.Task[Primed], float] = {}
        nxt = 0
        hedged = False
        last_err: ServeError | None = None
        deadline = self._routing.ttft_deadline_s

        def launch() -> None:
            nonlocal nxt
            cand = cands[nxt]
            self.tracker.acquire(cand.id)
            url = cand.url + req.path
            peer = self._peer(cand.state.info)
            task = asyncio.create_task(
                open_stream(self._pool, url, self._payload(body, cand), req.headers, deadline, peer)
            )
            tasks[task] = (nxt, cand)
            started[task] = time.perf_counter()
            nxt += 1

        try:
            launch()
            while tasks:
                timeout: float | None = None
                if hedge and not hedged and nxt < len(cands) and len(tasks) == 1:
                    (task, (_, cand)), *_ = tasks.items()
                    waited = time.perf_counter() - started[task]
                    timeout = max(0.0, self._hedge_delay_s(cand) - waited)
                done, _ = await asyncio.wait(
                    tasks, timeout=timeout, return_when=asyncio.FIRST_COMPLETED
                )
                if not done:
                    hedged = True
                    self.metrics.hedges.labels("started").inc()
                    launch()
                    continue
                winner: tuple[Primed, Scored, int] | None = None
                for task in done:
                    index, cand = tasks.pop(task)
                    exc = task.exception()
                    if exc is None:
                        if winner is None:
                            winner = (task.result(), cand, index)
                        else:  # a tie: keep the first, drop the other
                            await task.result().aclose()
                            self.tracker.release(cand.id)
                            self.tracker.abandoned(cand.id)
                        continue
                    err = translate_error(exc, cand.url)
                    self.tracker.release(cand.id)
                    if not self._move_on(cand, err):
                        raise err
                    if isinstance(err, ContextLengthExceeded):
                        cands = _after_overflow(cands, nxt, cand)
                    last_err = err
                if winner is not None:
                    primed, cand, index = winner
                    self.tracker.success(cand.id, primed.ttft_s * 1000.0)
                    if hedged:
                        self.metrics.hedges.labels("won" if index > 0 else "lost").inc()
                    return primed, cand, index, hedged and index > 0
                if not tasks and nxt < len(cands):
                    launch()
            assert last_err is not None
            raise last_err
        finally:
            for task, (_, cand) in tasks.items():
                task.cancel()
                with contextlib.suppress(BaseException):
                    await task
                self.tracker.release(cand.id)
                self.tracker.abandoned(cand.id)

    async def _in_turn(
        self, req: RouteRequest, cands: Sequence[Scored], body: dict[str, Any]
    ) -> tuple[Primed, Scored, int]:
        """Without a hedge: one attempt at a time, awaited in place (no task to schedule)."""
        last_err: ServeError | None = None
        deadline = self._routing.ttft_deadline_s
        overflowed: Scored | None = None
        for index, cand in enumerate(cands):
            if overflowed is not None and not larger_window(overflowed, cand):
                continue
            self.tracker.acquire(cand.id)
            try:
                payload = self._payload(body, cand)
                peer = self._peer(cand.state.info)
                primed = await open_stream(
                    self._pool, cand.url + req.path, payload, req.headers, deadline, peer
                )
            except Exception as exc:
                err = translate_error(exc, cand.url)
                self.tracker.release(cand.id)
                if not self._move_on(cand, err):
                    raise err from None
                last_err = err
                if isinstance(err, ContextLengthExceeded):
                    overflowed = cand
                continue
            except BaseException:  # cancelled: the client went away
                self.tracker.release(cand.id)
                self.tracker.abandoned(cand.id)
                raise
            self.tracker.success(cand.id, primed.ttft_s * 1000.0)
            return primed, cand, index
        assert last_err is not None
        raise last_err

    def _move_on(self, cand: Scored, err: ServeError) -> bool:
        """Book a failed attempt; whether the next candidate may be tried."""
        if isinstance(err, ContextLengthExceeded):
            self.tracker.abandoned(cand.id)
            self.metrics.fallbacks.labels(cand.tier, "context_length").inc()
            return True
        if not err.retryable:
            self.tracker.abandoned(cand.id)
            return False
        if isinstance(err, RateLimited):
            self.tracker.refused(cand.id, self._routing.shed_backoff_s)
        else:
            self.tracker.failure(cand.id)
        self.metrics.fallbacks.labels(cand.tier, _cause(err)).inc()
        return True

    async def resume(
        self, req: RouteRequest, state: StreamState, tried: list[str]
    ) -> tuple[Primed, Scored] | bytes | None:
        """Continue a broken stream elsewhere: the new upstream, closing bytes, or ``None``."""
        if state.continued >= self._routing.max_continuations:
            self.metrics.continuations.labels("exhausted").inc()
            return None
        body = continuation_body(req.upstream_body, state)
        if body is None:  # the token budget is spent: finish as the upstream would have
            self.metrics.continuations.labels("budget_spent").inc()
            return state.final_chunk("length") + DONE_FRAME
        try:
            decision = self._planner.plan(req.body, req.region, req.sticky, exclude=tried)
            cands = decision.candidates[: self._routing.max_attempts]
            primed, cand, _, _ = await self._race(req, cands, body, hedge=False)
        except ServeError:
            self.metrics.continuations.labels("failed").inc()
            return None
        self.metrics.continuations.labels("ok").inc()
        return primed, cand
