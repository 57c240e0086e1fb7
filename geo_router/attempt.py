"""One attempt at one candidate: sent, primed, relayed and released exactly once.

An :class:`Attempt` takes the candidate's in-flight slot when it is made and
owns everything of that one try: the request it sends (``upstream_body``),
the transport stream, its first-token deadline, the tracker bookkeeping, its
fallback metric and the prefix record. It gives the slot back through
exactly one verdict: :meth:`~Attempt.failed` (it never primed),
:meth:`~Attempt.finished` (the stream ended), :meth:`~Attempt.broke` (it
died mid-stream) or :meth:`~Attempt.abandon` (a lost hedge, a client that
left); a second verdict is a no-op. ``geo_router.dispatch`` decides which
attempts to make.

An attempt is *primed* when the upstream answered 200 and its first token (or
its end) arrived; only then does the router commit to the client, so connect
errors, 5xx, 429 and a missed deadline can still fail over. Two refusals move
on without counting as failures: a 429 (the instance is busy: it ranks last
for its ``Retry-After``, else ``shed_backoff_s``; its circuit stays closed)
and a ``context_length_exceeded`` 400 (the request is too long *there*).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from geo_router.conversation import turns_of
from geo_router.metrics import RouterMetrics
from geo_router.prefix_index import PrefixIndex
from geo_router.request import RouteRequest, upstream_body
from geo_router.routing_settings import RoutingSettings
from geo_router.scoring import Scored
from geo_router.spans import candidate_attributes
from geo_router.tracker import Tracker
from servekit.dispatch import Clock
from servekit.errors import (
    ContextLengthExceeded,
    RateLimited,
    ServeError,
    UpstreamTimeout,
    UpstreamUnavailable,
    upstream_failure,
)
from servekit.peers import PeerCredentials
from servekit.registry.protocol import InstanceInfo
from servekit.sse import EventReader, event_error
from servekit.tracing import OFF, Tracing, mark_failed
from servekit.transport import (
    FAILURES,
    Transport,
    UpstreamResponse,
    error_from_response,
    map_failure,
)

if TYPE_CHECKING:
    from opentelemetry.trace import Span

__all__ = ["Attempt", "Routing", "first_token_deadline_s"]

_DONE = b"data: [DONE]"


@dataclass(slots=True)
class Routing:
    """What every routed request shares (built once by the app's lifespan)."""

    pool: Transport
    tracker: Tracker
    metrics: RouterMetrics
    settings: RoutingSettings
    prefixes: PrefixIndex | None = None
    peers: Callable[[InstanceInfo], PeerCredentials | None] = lambda _info: None
    tracing: Tracing = OFF
    # The dispatch loop's clock: attempts' starts, deadlines and TTFTs are its readings
    # (a simulation passes its virtual event loop's ``time``).
    clock: Clock = time.perf_counter


def first_token_deadline_s(routing: RoutingSettings, cand: Scored) -> float:
    """How long an attempt at ``cand`` may wait for its first token while others
    are untried, never past the whole request's timeout: a multiple of the
    request's own predicted P90 there (at least ``prediction.deadline_min_s``), so a
    hung instance is cut within about this request's time; until the instance's
    model has learned, the fixed deadline, or a multiple of the formula's estimate
    when that is longer (a long prompt's prefill). With nobody left to try, an
    attempt waits for the whole timeout (``geo_router.dispatch``): cutting an
    instance that admitted the request would turn a slow answer into a 504."""
    p90 = cand.ttft_p90_ms
    if p90 is not None:
        learned = routing.prediction
        deadline = max(learned.deadline_min_s, learned.deadline_factor * p90 / 1000.0)
    else:
        predicted = routing.ttft_deadline_factor * cand.formula_ms / 1000.0
        deadline = max(routing.ttft_deadline_s, predicted)
    return min(deadline, routing.request_timeout_s)


def cause(err: ServeError) -> str:
    """The ``cause`` label of a fallback."""
    if isinstance(err, ContextLengthExceeded):
        return "context_length"
    if isinstance(err, UpstreamTimeout):
        return "timeout"
    if isinstance(err, UpstreamUnavailable):
        return "unavailable"
    if isinstance(err, RateLimited):
        return "rate_limited"
    return "error"


def _has_token(event: Mapping[str, Any]) -> bool:
    choices = event.get("choices")
    if not isinstance(choices, list) or not choices or not isinstance(choices[0], dict):
        return False
    choice = choices[0]
    if choice.get("finish_reason"):
        return True
    delta = choice.get("delta")
    if isinstance(delta, dict) and delta.get("content"):
        return True
    return bool(choice.get("text"))


class Attempt:
    """``cand``'s in-flight slot from creation until its one verdict."""

    __slots__ = (
        "_chunks",
        "_ended",
        "_reader",
        "_response",
        "_routing",
        "cand",
        "deadline",
        "head",
        "index",
        "req",
        "span",
        "started",
        "ttft_s",
        "url",
        "waited_s",
    )

    def __init__(
        self,
        routing: Routing,
        req: RouteRequest,
        cand: Scored,
        index: int,
        *,
        hedge: bool = False,
        waited_s: float = 0.0,
    ) -> None:
        self._routing = routing
        self.req = req
        self.cand = cand
        self.index = index  # its place in the try order
        self.waited_s = waited_s  # spent before an instance refused it (geo_router.dispatch)
        self.url = cand.url + req.path
        self.started = routing.clock()  # the dispatch loop's clock (servekit.dispatch)
        # Its first token by then, or it is cut while somebody else is left to try.
        self.deadline = self.started + first_token_deadline_s(routing.settings, cand)
        self.head = b""  # the complete events read while priming
        self.ttft_s = 0.0
        self._response: UpstreamResponse | None = None
        self._chunks: AsyncIterator[bytes] | None = None
        self._reader = EventReader()
        self._ended = False
        self.span: Span | None = None
        if req.span is not None:  # tracing on: the request's child, the upstream's parent
            attrs = candidate_attributes(cand)
            attrs.update({"attempt.index": index, "attempt.hedge": hedge})
            self.span = routing.tracing.start(
                "router.attempt", parent=req.span, at=self.started, attributes=attrs
            )
        routing.tracker.acquire(cand.id)

    @property
    def ended(self) -> bool:
        return self._ended

    async def prime(self) -> None:
        """Send the request and read up to its first token; raises what went wrong
        (foreign failures as they are: :meth:`failed` maps them). The whole
        request's timeout bounds it; the first-token deadline is the dispatcher's."""
        r, cand = self._routing, self.cand
        headers = self.req.headers
        if cand.prompt_tokens or self.span is not None or self.waited_s > 0:
            headers = dict(headers)  # this attempt's own: the request's are shared
            if cand.prompt_tokens:  # what admission there charges for this request's prefill
                headers["x-prefill-tokens"] = str(max(1, cand.prompt_tokens - cand.cached_tokens))
            if self.waited_s > 0:  # and what the request spent where it was refused
                headers["x-waited-ms"] = str(int(self.waited_s * 1000.0))
            if self.span is not None:
                r.tracing.inject(self.span, headers)
        try:
            async with asyncio.timeout(r.settings.request_timeout_s):
                self._response = response = await r.pool.post(
                    self.url,
                    upstream_body(self.req, self.cand),
                    headers,
                    r.peers(self.cand.state.info),
                )
                if response.status != 200:
                    raw = await response.read()
                    retry = response.headers.get("retry-after")
                    raise error_from_response(response.status, raw, retry, self.url)
                self._chunks = chunks = response.chunks()
                reader = self._reader
                async for chunk in chunks:
                    complete = reader.split(chunk)
                    if not complete:
                        continue
                    self.head += complete
                    events = reader.parse(complete)
                    for event in events:
                        err = event_error(event)
                        if err is not None:
                            raise err
                    if reader.done or any(_has_token(e) for e in events):
                        response.flowing()  # silence is timed from the first token on
                        self.ttft_s = r.clock() - self.started
                        if self.span is not None:
                            self.span.add_event("first_token")
                            self.span.set_attribute("attempt.ttft_ms", self.ttft_s * 1e3)
                        return
                raise upstream_failure(
                    "broken", self.url, "the stream ended before its first token"
                )
        except BaseException:
            self._close()
            raise

    def missed(self) -> ServeError:
        """It missed its first-token deadline while others were left: judged as failed."""
        waited = self.deadline - self.started
        if not self._ended:
            self._routing.tracker.late(self.cand.id, waited * 1000.0, self.cand.prediction)
        err = upstream_failure("timeout", self.url, f"no first token within {waited:g}s")
        return self.failed(err)

    def won(self) -> None:
        """It primed first and its first bytes are on their way to the client (the
        stream books it then, off the path to the first token): the TTFT counts,
        its prefix is recorded where it went; the slot stays taken while it streams."""
        r, cand = self._routing, self.cand
        ttft_ms = self.ttft_s * 1000.0
        predicted = cand.prediction
        r.tracker.success(cand.id, ttft_ms, predicted)
        if predicted is not None and predicted.median_ms > 0:
            source = "learned" if predicted.learned else "formula"
            r.metrics.prediction.labels(cand.tier, source).observe(ttft_ms / predicted.median_ms)
        if self.span is not None:
            self.span.set_attribute("attempt.won", True)
        if r.prefixes is not None and cand.prefix is not None:
            kv = _kv_tokens(cand)
            r.prefixes.served(cand.id, cand.prefix, kv, warming=cand.warming, rent_ms=cand.rent_ms)

    def answered(self, body: Mapping[str, Any], answer: str, cache_salt: str | None) -> None:
        """Its stream ended well with ``answer``: the instance holds it beside the
        prompt, as the conversation's next turn will send it back
        (``PrefixIndex.answered``). Not a trimmed request's: the next turn's history
        is the whole one, which that instance does not hold."""
        r, cand = self._routing, self.cand
        if r.prefixes is None or cand.prefix is None or cand.trim is not None:
            return
        if "messages" not in body:  # a raw prompt: no turns to send back
            return
        r.prefixes.answered(
            cand.id,
            turns_of(body),
            answer,
            tokens_per_block=cand.prefix.tokens_per_block,
            cache_salt=cache_salt,
            limit_tokens=_kv_tokens(cand),
        )

    def failed(self, exc: BaseException) -> ServeError:
        """It never primed: its error, raised if nobody else may try, returned if the
        next candidate may (counted as a fallback)."""
        err = map_failure(exc, self.url)
        if not self._release(cause(err), err):
            return err
        r, iid = self._routing, self.cand.id
        if isinstance(err, ContextLengthExceeded):
            r.tracker.abandoned(iid)
        elif not err.retryable:
            r.tracker.abandoned(iid)
            raise err
        elif isinstance(err, RateLimited):
            backoff = err.retry_after if err.retry_after is not None else None
            r.tracker.refused(iid, r.settings.shed_backoff_s if backoff is None else backoff)
        else:
            r.tracker.failure(iid)
        r.metrics.fallbacks.labels(self.cand.tier, cause(err)).inc()
        return err

    async def relay(self) -> AsyncIterator[bytes]:
        """The rest of the stream, cut at event boundaries (never half an event);
        raises a :class:`ServeError` when it breaks off before ``[DONE]``."""
        reader, chunks = self._reader, self._chunks
        if reader.done or chunks is None:
            return
        try:
            # Idle gaps are bounded by the pool's read timeout.
            async for chunk in chunks:
                complete = reader.split(chunk)
                if not complete:
                    continue
                if b'"error"' in complete:  # the hot path parses nothing else
                    for event in reader.parse(complete):
                        err = event_error(event)
                        if err is not None:
                            raise err
                yield complete
                if _DONE in complete:
                    reader.done = True
                    return
        except FAILURES as exc:
            raise map_failure(exc, self.url) from None
        raise upstream_failure("broken", self.url, "the stream ended early")

    async def finished(self) -> None:
        """The stream ended well: read its tail so the connection is reused."""
        if not self._release("ok"):
            return
        response, chunks = self._response, self._chunks
        self._response = None
        if response is None or chunks is None:
            return
        try:
            async with asyncio.timeout(1.0):
                async for _ in chunks:
                    pass
        except FAILURES:
            response.close()
            return
        response.release()

    async def broke(self) -> None:
        """It died mid-stream: a failure of the instance."""
        if self._release("broke"):
            self._routing.tracker.failure(self.cand.id)
        self._close()

    async def abandon(self) -> None:
        """Ended without a verdict (a lost hedge or tie, a client that left)."""
        if self._release("abandoned"):
            self._routing.tracker.abandoned(self.cand.id)
        self._close()

    def _close(self) -> None:
        response, self._response = self._response, None
        if response is not None:
            response.close()

    def _release(self, outcome: str, err: ServeError | None = None) -> bool:
        if self._ended:
            return False
        self._ended = True
        self._routing.tracker.release(self.cand.id)
        span = self.span
        if span is not None:
            span.set_attribute("attempt.outcome", outcome)
            if err is not None:
                mark_failed(span, err)
            span.end()
        return True


def _kv_tokens(cand: Scored) -> int | None:
    """The tokens of KV cache the instance holds at most, when it reports its window."""
    load = cand.state.load
    return load.capacity * load.max_context_tokens if load.max_context_tokens else None
