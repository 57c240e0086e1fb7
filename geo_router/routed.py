"""A routed request: its attempts, hedges and continuations, and its metrics.

:meth:`RoutedStream.open` tries the planner's candidates in order until one is
primed (200 and a first token), racing a hedge when the current attempt is
slower than its instance's recent P95 TTFT (losers are cancelled). Iterating
the stream yields the client's bytes; when the upstream dies mid-stream the
stream re-plans without the instances tried so far and splices a
continuation in (``geo_router.continuation``), or ends with an error event.
Each attempt is an :class:`~geo_router.dispatch.Attempt` (tracker
bookkeeping, exactly once); ``geo_router.relay`` only moves bytes and
rewrites events. Every metric of a routed request is recorded here.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncGenerator, Callable, Sequence
from dataclasses import dataclass
from typing import Any

from geo_router.continuation import Kind, StreamState, continuation_body
from geo_router.dispatch import (
    Attempt,
    after_overflow,
    cause,
    first_token_deadline_s,
    hedge_delay_s,
    larger_window,
    payload,
)
from geo_router.http_client import UpstreamPool
from geo_router.metrics import RouterMetrics
from geo_router.planner import Decision, Planner
from geo_router.prefix_index import PrefixIndex
from geo_router.region import ResolvedRegion
from geo_router.relay import Pump, rewrite
from geo_router.scoring import Scored
from geo_router.settings import RoutingSettings
from geo_router.tracker import Tracker
from geo_router.upstream import Primed, no_first_token, open_stream, translate_error
from servekit.errors import ContextLengthExceeded, NotReady, ServeError
from servekit.peers import PeerCredentials
from servekit.registry.protocol import InstanceInfo
from servekit.sse import DONE_FRAME, encode_error

__all__ = ["RouteRequest", "RoutedStream", "Routing"]


@dataclass(slots=True)
class RouteRequest:
    body: dict[str, Any]  # the validated client body
    kind: Kind
    path: str
    region: ResolvedRegion
    sticky: str
    headers: dict[str, str]  # sent upstream (priority, request id)
    arrived: float  # perf_counter at arrival
    upstream_body: dict[str, Any]  # the body as sent upstream (always streamed)
    tenant: str | None = None  # its API key's tenant (trimming policy per tenant)


@dataclass(slots=True)
class Routing:
    """What every routed request shares (built once by the app's lifespan)."""

    pool: UpstreamPool
    planner: Planner
    tracker: Tracker
    metrics: RouterMetrics
    settings: RoutingSettings
    prefixes: PrefixIndex | None = None
    peers: Callable[[InstanceInfo], PeerCredentials | None] = lambda _info: None


class RoutedStream:
    """One request from its first attempt to its last byte; iterate for client bytes."""

    def __init__(self, routing: Routing, req: RouteRequest, decision: Decision) -> None:
        self._r = routing
        self._req = req
        self._decision = decision
        self.state = StreamState(req.kind)  # what was said (a non-streamed answer reads it)
        self._attempt: Attempt | None = None  # the one streaming now
        self._chunks: AsyncGenerator[bytes, None] | None = None
        self.cand: Scored | None = None  # the first primed candidate (the route headers)
        self.reason = ""

    async def open(self) -> None:
        """Prime the first attempt; raise the last attempt's error when none primes."""
        settings = self._r.settings
        cands = self._decision.candidates[: settings.max_attempts]
        # A warming attempt is a cold start on purpose: a hedge would cancel it.
        hedge = settings.hedge.enabled and not (cands and cands[0].warming)
        attempt, hedged = await self._race(cands, self._req.upstream_body, hedge)
        cand = attempt.cand
        if hedged:
            self.reason = "hedge"
        elif attempt.index > 0:
            self.reason = "fallback"
        else:
            self.reason = self._decision.reason(cand)
        prefixes = self._r.prefixes
        if prefixes is not None and cand.prefix is not None:
            load = cand.state.load
            kv = load.capacity * load.max_context_tokens if load.max_context_tokens else None
            prefixes.record(cand.id, cand.prefix, kv)
        self._attempt, self.cand = attempt, cand
        self._chunks = self._bytes()

    def __aiter__(self) -> AsyncGenerator[bytes, None]:
        assert self._chunks is not None, "open() first"
        return self._chunks

    async def aclose(self) -> None:
        """Stop: the current attempt is given up unless it already ended."""
        if self._chunks is not None:
            await self._chunks.aclose()
        if self._attempt is not None:
            await self._attempt.abandon()  # never iterated: the generator's finally did not run

    async def _bytes(self) -> AsyncGenerator[bytes, None]:
        attempt = self._attempt
        assert attempt is not None, "open() first"
        primed = attempt.primed
        assert primed is not None
        req, state, m = self._req, self.state, self._r.metrics
        tier, region = attempt.cand.tier, req.region.region
        tried = [attempt.cand.id]
        sent_before: int | None = None  # set while a continuation is spliced in
        try:
            now = time.perf_counter()
            if primed.head:
                state.record(primed.head)
                yield primed.head
                now = time.perf_counter()
            # Accounting waits until the first bytes are on their way to the client.
            m.ttft.labels(tier, region).observe(now - req.arrived)
            m.overhead.observe(max(0.0, now - req.arrived - primed.ttft_s))
            m.decisions.labels(tier, region, self.reason).inc()
            itl = m.itl.labels(tier, region)
            last = now
            while True:
                pump = Pump(primed, state, sent_before)
                async for out in pump.run():
                    yield out
                    now = time.perf_counter()
                    itl.observe(now - last)
                    last = now
                if pump.error is None:
                    await attempt.finished()
                    return
                # The upstream died mid-stream: continue elsewhere, or end cleanly.
                await attempt.broke()
                state.sync()
                resumed = await self._resume(tried)
                if isinstance(resumed, bytes):
                    if not resumed:
                        state.error = pump.error
                        resumed = encode_error(pump.error) + DONE_FRAME
                    yield resumed
                    return
                self._attempt = attempt = resumed
                assert resumed.primed is not None
                primed = resumed.primed
                tried.append(attempt.cand.id)
                sent_before = state.tokens
                state.continued += 1
                out = rewrite(state, primed, primed.head, sent_before)
                if out:
                    yield out
        finally:
            await attempt.abandon()  # a no-op for an attempt already judged
            m.e2e.labels(tier, region).observe(time.perf_counter() - req.arrived)

    async def _resume(self, tried: list[str]) -> Attempt | bytes:
        """A continuation's attempt, closing bytes, or ``b""`` when nobody can go on."""
        r, state, req = self._r, self.state, self._req
        outcome = r.metrics.continuations
        if state.continued >= r.settings.max_continuations:
            outcome.labels("exhausted").inc()
            return b""
        body = continuation_body(req.upstream_body, state)
        if body is None:  # the token budget is spent: finish as the upstream would have
            outcome.labels("budget_spent").inc()
            return state.final_chunk("length") + DONE_FRAME
        try:
            decision = r.planner.plan(req.body, req.region, req.sticky, tried, req.tenant)
            cands = decision.candidates[: r.settings.max_attempts]
            attempt, _ = await self._race(cands, body, hedge=False)
        except ServeError:
            outcome.labels("failed").inc()
            return b""
        outcome.labels("ok").inc()
        return attempt

    # -- attempts before the first byte --------------------------------------

    def _start(
        self, cand: Scored, index: int, body: dict[str, Any], last: bool
    ) -> tuple[Attempt, Any]:
        """An attempt at ``cand`` (``last``: nobody is left after it) and the
        coroutine that primes it."""
        r = self._r
        attempt = Attempt(r.tracker, cand, index)
        url = cand.url + self._req.path
        prime = open_stream(
            r.pool,
            url,
            payload(body, cand),
            self._req.headers,
            first_token_deadline_s(r.settings, cand, last),
            r.peers(cand.state.info),
        )
        return attempt, prime

    def _failed(self, attempt: Attempt, exc: BaseException) -> ServeError:
        """Judge an attempt that did not prime; raise its error if nobody else may try."""
        err = translate_error(exc, attempt.cand.url)
        if not attempt.failed(err, self._r.settings.shed_backoff_s):
            raise err from None
        self._r.metrics.fallbacks.labels(attempt.cand.tier, cause(err)).inc()
        return err

    async def _race(
        self, cands: Sequence[Scored], body: dict[str, Any], hedge: bool
    ) -> tuple[Attempt, bool]:
        """The first attempt to prime, trying ``cands`` in order; hedged when slow."""
        if not cands:
            raise NotReady("no healthy upstream can serve this request", retry_after=1)
        if not hedge or len(cands) < 2:
            return await self._in_turn(cands, body), False
        racing: dict[asyncio.Task[Primed], Attempt] = {}
        started: dict[Attempt, float] = {}
        deadline: dict[Attempt, float] = {}  # first token by then, while others are untried
        order, nxt, hedged = list(cands), 0, False
        last_err: ServeError | None = None
        settings = self._r.settings

        def launch() -> None:
            nonlocal nxt
            # Its own timer is the whole request's: the first-token deadline is kept
            # here, where it is known whether anybody is left to move on to.
            attempt, prime = self._start(order[nxt], nxt, body, last=True)
            racing[asyncio.create_task(prime)] = attempt
            now = time.perf_counter()
            started[attempt] = now
            deadline[attempt] = now + first_token_deadline_s(settings, attempt.cand)
            nxt += 1

        try:
            while True:
                if not racing:
                    if nxt >= len(order):
                        assert last_err is not None
                        raise last_err
                    launch()
                timers: list[float] = []
                if nxt < len(order):
                    timers += [deadline[a] for a in racing.values()]
                    if not hedged and len(racing) == 1:
                        (only,) = racing.values()
                        delay = hedge_delay_s(settings.hedge, self._r.tracker, only.cand)
                        timers.append(started[only] + delay)
                timeout = None if not timers else max(0.0, min(timers) - time.perf_counter())
                done, _ = await asyncio.wait(
                    racing, timeout=timeout, return_when=asyncio.FIRST_COMPLETED
                )
                if not done:
                    now = time.perf_counter()
                    late = [(t, a) for t, a in racing.items() if now >= deadline[a]]
                    for task, attempt in late:  # missed its first token: move on
                        del racing[task]
                        task.cancel()
                        with contextlib.suppress(BaseException):
                            await task
                        waited = deadline[attempt] - started[attempt]
                        last_err = self._failed(attempt, no_first_token(attempt.cand.url, waited))
                    if not late:
                        hedged = True
                        self._r.metrics.hedges.labels("started").inc()
                        launch()
                    continue
                winner: Attempt | None = None
                for task in done:
                    attempt = racing.pop(task)
                    exc = task.exception()
                    if exc is not None:
                        last_err = self._failed(attempt, exc)
                        if isinstance(last_err, ContextLengthExceeded):
                            order = after_overflow(order, nxt, attempt.cand)
                    elif winner is None:
                        winner = attempt
                        attempt.won(task.result())
                    else:  # a tie: keep the first, drop the other
                        await attempt.abandon(task.result())
                if winner is not None:
                    if hedged:
                        self._r.metrics.hedges.labels("won" if winner.index > 0 else "lost").inc()
                    return winner, hedged and winner.index > 0
        finally:
            for task, attempt in racing.items():
                task.cancel()
                with contextlib.suppress(BaseException):
                    await task
                await attempt.abandon()

    async def _in_turn(self, cands: Sequence[Scored], body: dict[str, Any]) -> Attempt:
        """Without a hedge: one attempt at a time, awaited in place (no task to schedule)."""
        last_err: ServeError | None = None
        overflowed: Scored | None = None
        for index, cand in enumerate(cands):
            if overflowed is not None and not larger_window(overflowed, cand):
                continue
            later = cands[index + 1 :]
            if overflowed is not None:
                later = [c for c in later if larger_window(overflowed, c)]
            attempt, prime = self._start(cand, index, body, not later)
            try:
                attempt.won(await prime)
                return attempt
            except Exception as exc:
                last_err = self._failed(attempt, exc)
                if isinstance(last_err, ContextLengthExceeded):
                    overflowed = cand
            except BaseException:  # cancelled: the client went away
                await attempt.abandon()
                raise
        assert last_err is not None
        raise last_err
