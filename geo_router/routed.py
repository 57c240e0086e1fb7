"""A routed request from its first attempt to its last byte, and its metrics.

:meth:`RoutedStream.open` takes the first primed attempt of the planner's
try order from the dispatcher (``geo_router.dispatch``). Iterating the stream
yields the client's bytes: the upstream's events pass through untouched (no
JSON work on the hot path) and are kept in the request's
:class:`~geo_router.continuation.Transcript`. When the upstream dies
mid-stream, the request is extended by the partial answer
(``geo_router.request.continued``), re-planned without the instances tried
so far and dispatched through the same loop, and the continuation's events
are spliced into the stream; when nobody can go on, the stream ends with an
error event. The request's own metrics (TTFT, router overhead, inter-token
gaps, E2E, route decisions, continuations) are recorded here; each
attempt's are its own (``geo_router.attempt``).
"""

from __future__ import annotations

import time
from collections.abc import AsyncGenerator

from geo_router.attempt import Attempt, Routing
from geo_router.continuation import Transcript
from geo_router.dispatch import first_primed
from geo_router.planner import Decision, Planner
from geo_router.request import RouteRequest, continued
from geo_router.scoring import Scored
from servekit.errors import ServeError
from servekit.sse import DONE_FRAME, encode_error

__all__ = ["RoutedStream"]


class RoutedStream:
    """One request from its first attempt to its last byte; iterate for client bytes."""

    def __init__(
        self, routing: Routing, planner: Planner, req: RouteRequest, decision: Decision
    ) -> None:
        self._r = routing
        self._planner = planner  # re-plans a continuation
        self._req = req
        self._decision = decision
        self.transcript = Transcript(req.kind)  # what was said (a non-streamed answer reads it)
        self._attempt: Attempt | None = None  # the one streaming now
        self._chunks: AsyncGenerator[bytes, None] | None = None
        self.cand: Scored | None = None  # the first primed candidate (the route headers)
        self.reason = ""

    async def open(self) -> None:
        """Prime the first attempt; raise the last attempt's error when none primes."""
        cands = self._decision.candidates[: self._r.settings.max_attempts]
        # A warming attempt is a cold start on purpose: a hedge would cancel it.
        hedge = self._r.settings.hedge.enabled and not (cands and cands[0].warming)
        attempt, hedged = await first_primed(self._r, self._req, cands, hedge=hedge)
        if hedged:
            self.reason = "hedge"
        elif attempt.index > 0:
            self.reason = "fallback"
        else:
            self.reason = self._decision.reason(attempt.cand)
        self._attempt, self.cand = attempt, attempt.cand
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
        req, said, m = self._req, self.transcript, self._r.metrics
        tier, region = attempt.cand.tier, req.region.region
        tried = [attempt.cand.id]
        sent_before: int | None = None  # set while a continuation is spliced in
        try:
            now = time.perf_counter()
            if attempt.head:
                said.record(attempt.head)
                yield attempt.head
                now = time.perf_counter()
            # Accounting waits until the first bytes are on their way to the client.
            attempt.won()
            m.ttft.labels(tier, region).observe(now - req.arrived)
            m.overhead.observe(max(0.0, now - req.arrived - attempt.ttft_s))
            m.decisions.labels(tier, region, self.reason).inc()
            itl = m.itl.labels(tier, region)
            last = now
            while True:
                try:
                    async for out in attempt.relay():
                        if sent_before is None:
                            said.record(out)
                        else:
                            out = said.splice_events(out, sent_before)
                        yield out
                        now = time.perf_counter()
                        itl.observe(now - last)
                        last = now
                    await attempt.finished()
                    if sent_before is None:  # one instance said it all, and holds it
                        said.sync()
                        attempt.answered(req.body, said.text, req.cache_salt)
                    return
                except ServeError as exc:
                    error = exc
                said.sync()
                if said.finish_reason is not None:  # finished without [DONE]: close it
                    await attempt.finished()
                    yield DONE_FRAME
                    return
                # The upstream died mid-stream: continue elsewhere, or end cleanly.
                await attempt.broke()
                resumed = await self._resume(tried)
                if isinstance(resumed, bytes):
                    if not resumed:
                        said.error = error
                        resumed = encode_error(error) + DONE_FRAME
                    yield resumed
                    return
                self._attempt = attempt = resumed
                tried.append(attempt.cand.id)
                sent_before = said.tokens
                said.continued += 1
                out = said.splice_events(attempt.head, sent_before)
                if out:
                    yield out
                attempt.won()
        finally:
            await attempt.abandon()  # a no-op for an attempt already judged
            m.e2e.labels(tier, region).observe(time.perf_counter() - req.arrived)

    async def _resume(self, tried: list[str]) -> Attempt | bytes:
        """A continuation's attempt, closing bytes, or ``b""`` when nobody can go on."""
        began = time.perf_counter()
        resumed = await self._continue(tried)
        span = self._req.span
        if span is not None:
            outcome = "ok" if isinstance(resumed, Attempt) else "closed" if resumed else "failed"
            attrs: dict[str, str | int] = {
                "continuation.outcome": outcome,
                "continuation.tokens_before": self.transcript.tokens,
            }
            if isinstance(resumed, Attempt):
                attrs["route.instance"] = resumed.cand.id
            self._r.tracing.record("router.continuation", span, began, time.perf_counter(), attrs)
        return resumed

    async def _continue(self, tried: list[str]) -> Attempt | bytes:
        r, said = self._r, self.transcript
        outcome = r.metrics.continuations
        if said.continued >= r.settings.max_continuations:
            outcome.labels("exhausted").inc()
            return b""
        req = continued(self._req, said.partial())
        if req is None:  # the token budget is spent: finish as the upstream would have
            outcome.labels("budget_spent").inc()
            return said.final_chunk("length") + DONE_FRAME
        try:
            # Re-planned as sent: window fit and trimming see the partial answer.
            decision = self._planner.plan(
                req.body,
                req.region,
                req.sticky,
                tried,
                tenant=req.tenant,
                use_case=req.use_case,
                cache_salt=req.cache_salt,
            )
            cands = decision.candidates[: r.settings.max_attempts]
            attempt, _ = await first_primed(r, req, cands, hedge=False)
        except ServeError:
            outcome.labels("failed").inc()
            return b""
        outcome.labels("ok").inc()
        return attempt
