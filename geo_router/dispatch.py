"""Dispatch: failover before the first byte, hedging, and mid-stream continuation.

:meth:`Dispatcher.open` tries candidates in the planner's order until one is
primed (200 and a first token), optionally racing a hedge when the current
attempt is slower than its instance's recent P95 TTFT; losers are cancelled.
:meth:`Dispatcher.relay` then passes the upstream's SSE bytes through
untouched, cut at event boundaries so a failure never leaves half an event,
and on upstream death continues the answer on another instance.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import AsyncGenerator, AsyncIterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import aiohttp

from geo_router.continuation import Kind, StreamState, continuation_body
from geo_router.metrics import RouterMetrics
from geo_router.planner import Decision, Planner
from geo_router.region import ResolvedRegion
from geo_router.scoring import Scored
from geo_router.settings import RoutingSettings
from geo_router.tracker import Tracker
from geo_router.upstream import (
    TRANSPORT_ERRORS,
    Primed,
    open_stream,
    parse_events,
    split_events,
    translate_error,
)
from servekit.errors import (
    NotReady,
    RateLimited,
    ServeError,
    UpstreamTimeout,
    UpstreamUnavailable,
    error_from_body,
)
from servekit.sse import DONE_FRAME, encode_error

__all__ = ["Dispatcher", "Opened", "RouteRequest"]


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


def _cause(err: ServeError) -> str:
    if isinstance(err, UpstreamTimeout):
        return "timeout"
    if isinstance(err, UpstreamUnavailable):
        return "unavailable"
    if isinstance(err, RateLimited):
        return "rate_limited"
    return "error"


class Dispatcher:
    def __init__(
        self,
        session: aiohttp.ClientSession,
        planner: Planner,
        tracker: Tracker,
        metrics: RouterMetrics,
        routing: RoutingSettings,
    ) -> None:
        self._session = session
        self._planner = planner
        self._tracker = tracker
        self._metrics = metrics
        self._routing = routing

    async def open(self, req: RouteRequest, decision: Decision) -> Opened:
        cands = decision.candidates[: self._routing.max_attempts]
        hedge = self._routing.hedge.enabled
        primed, cand, index, hedged = await self._race(req, cands, req.upstream_body, hedge)
        if hedged:
            reason = "hedge"
        elif index > 0:
            reason = "fallback"
        else:
            reason = decision.reason(cand)
        self._metrics.decisions.labels(cand.tier, req.region.region, reason).inc()
        return Opened(primed, cand, reason)

    def _payload(self, body: dict[str, Any], cand: Scored) -> bytes:
        out = dict(body)
        out["model"] = cand.state.info.model
        return json.dumps(out, ensure_ascii=False, separators=(",", ":")).encode()

    def _hedge_delay_s(self, cand: Scored) -> float:
        hedge = self._routing.hedge
        p95 = self._tracker.stats(cand.id).ttft_p95_ms() or cand.state.load.ttft_p95_ms
        delay = p95 if p95 is not None else hedge.default_delay_ms
        return max(hedge.min_delay_ms, delay) / 1000.0

    async def _race(
        self, req: RouteRequest, cands: Sequence[Scored], body: dict[str, Any], hedge: bool
    ) -> tuple[Primed, Scored, int, bool]:
        """The first candidate to prime, trying them in order; hedged when slow."""
        tasks: dict[asyncio.Task[Primed], tuple[int, Scored]] = {}
        started: dict[asyncio.Task[Primed], float] = {}
        nxt = 0
        hedged = False
        last_err: ServeError | None = None
        deadline = self._routing.ttft_deadline_s

        def launch() -> None:
            nonlocal nxt
            cand = cands[nxt]
            self._tracker.acquire(cand.id)
            url = cand.url + req.path
            task = asyncio.create_task(
                open_stream(self._session, url, self._payload(body, cand), req.headers, deadline)
            )
            tasks[task] = (nxt, cand)
            started[task] = time.perf_counter()
            nxt += 1

        try:
            if not cands:
                raise NotReady("no healthy upstream can serve this request", retry_after=1)
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
                    self._metrics.hedges.labels("started").inc()
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
                            self._tracker.release(cand.id)
                            self._tracker.abandoned(cand.id)
                        continue
                    err = translate_error(exc, cand.url)
                    self._tracker.release(cand.id)
                    if not err.retryable:
                        self._tracker.abandoned(cand.id)
                        raise err
                    self._tracker.failure(cand.id)
                    self._metrics.fallbacks.labels(cand.tier, _cause(err)).inc()
                    last_err = err
                if winner is not None:
                    primed, cand, index = winner
                    self._tracker.success(cand.id, primed.ttft_s * 1000.0)
                    if hedged:
                        self._metrics.hedges.labels("won" if index > 0 else "lost").inc()
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
                self._tracker.release(cand.id)
                self._tracker.abandoned(cand.id)
            self._publish_circuits(cands)

    def _publish_circuits(self, cands: Sequence[Scored]) -> None:
        for cand in cands:
            self._metrics.circuit.labels(cand.id).set(int(self._tracker.stats(cand.id).circuit))

    async def relay(
        self, req: RouteRequest, opened: Opened, state: StreamState, passthrough: bool = True
    ) -> AsyncGenerator[bytes, None]:
        """Client bytes for the stream; ``state`` collects what was said."""
        primed, cand = opened.primed, opened.cand
        tier, region = cand.tier, req.region.region
        tried = [cand.id]
        rewriting = False
        sent_before = 0
        first = True
        last = time.perf_counter()
        released = False
        try:
            while True:
                for event in primed.events:
                    state.observe(event)
                out = self._emit(
                    state, primed.events, primed.head, primed.done, rewriting, sent_before
                )
                if out:
                    yield out
                now = time.perf_counter()
                if first:
                    first = False
                    self._metrics.ttft.labels(tier, region).observe(now - req.arrived)
                    overhead = max(0.0, now - req.arrived - primed.ttft_s)
                    self._metrics.overhead.observe(overhead)
                last = now
                pump = _Pump(self, primed, state, rewriting, sent_before)
                async for out in pump.run():
                    yield out
                    now = time.perf_counter()
                    self._metrics.itl.labels(tier, region).observe(now - last)
                    last = now
                error = pump.error
                if error is None:
                    self._tracker.release(cand.id)
                    released = True
                    await primed.finish()
                    return
                # The upstream died mid-stream: continue elsewhere, or end cleanly.
                self._tracker.release(cand.id)
                self._tracker.failure(cand.id)
                released = True
                await primed.aclose()
                nxt = await self._continue(req, state, tried)
                if nxt is None:
                    state.error = error
                    yield encode_error(error) + DONE_FRAME
                    return
                if isinstance(nxt, bytes):
                    yield nxt
                    return
                primed, cand = nxt
                tried.append(cand.id)
                released = False
                rewriting = True
                sent_before = state.tokens
                state.continued += 1
        finally:
            await primed.aclose()
            if not released:
                self._tracker.release(cand.id)
                self._tracker.abandoned(cand.id)
            self._metrics.e2e.labels(tier, region).observe(time.perf_counter() - req.arrived)

    def _emit(
        self,
        state: StreamState,
        events: list[dict[str, Any]],
        raw: bytes,
        done: bool,
        rewriting: bool,
        sent_before: int,
    ) -> bytes:
        if not rewriting:
            return raw
        parts = [state.rewrite(e, sent_before) for e in events]
        out = b"".join(p for p in parts if p)
        return out + DONE_FRAME if done else out

    async def _continue(
        self, req: RouteRequest, state: StreamState, tried: list[str]
    ) -> tuple[Primed, Scored] | bytes | None:
        if state.continued >= self._routing.max_continuations:
            self._metrics.continuations.labels("exhausted").inc()
            return None
        body = continuation_body(req.upstream_body, state)
        if body is None:  # the token budget is spent: finish as the upstream would have
            self._metrics.continuations.labels("budget_spent").inc()
            return state.final_chunk("length") + DONE_FRAME
        try:
            decision = self._planner.plan(req.body, req.region, req.sticky, exclude=tried)
            cands = decision.candidates[: self._routing.max_attempts]
            primed, cand, _, _ = await self._race(req, cands, body, hedge=False)
        except ServeError:
            self._metrics.continuations.labels("failed").inc()
            return None
        self._metrics.continuations.labels("ok").inc()
        return primed, cand


class _Pump:
    """Reads the rest of one upstream stream; ``error`` is set if it broke off."""

    def __init__(
        self,
        owner: Dispatcher,
        primed: Primed,
        state: StreamState,
        rewriting: bool,
        sent_before: int,
    ) -> None:
        self._owner = owner
        self._primed = primed
        self._state = state
        self._rewriting = rewriting
        self._sent_before = sent_before
        self.error: ServeError | None = None

    async def run(self) -> AsyncIterator[bytes]:
        primed, state = self._primed, self._state
        if primed.done:
            return
        pending = primed.rest
        idle = self._owner._routing.idle_timeout_s
        try:
            while True:
                try:
                    async with asyncio.timeout(idle):
                        chunk = await anext(primed.chunks)
                except StopAsyncIteration:
                    if state.finish_reason is not None:
                        yield DONE_FRAME  # finished without [DONE]: close it properly
                        return
                    raise UpstreamUnavailable(
                        f"upstream {primed.url} ended the stream early"
                    ) from None
                complete, pending = split_events(pending + chunk)
                if not complete:
                    continue
                events, done = parse_events(primed.decoder, complete)
                for event in events:
                    if isinstance(event.get("error"), dict):
                        raise error_from_body(502, event)
                    state.observe(event)
                yield self._owner._emit(
                    state, events, complete, done, self._rewriting, self._sent_before
                )
                if done:
                    return
        except (*TRANSPORT_ERRORS, ServeError) as exc:
            self.error = translate_error(exc, primed.url)
