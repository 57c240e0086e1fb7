"""Relaying one routed stream to the client, and splicing in continuations.

Upstream SSE bytes pass through untouched, cut at event boundaries so a
failure never leaves half an event with the client. The hot path does no
JSON work: complete events are kept raw in the :class:`StreamState` and only
parsed when something needs their content (a continuation, a non-streamed
answer, an event that mentions ``"error"``). A continuation's events are
rewritten into the original stream (the slow path, taken once per failure).
"""

from __future__ import annotations

import time
from collections.abc import AsyncGenerator, AsyncIterator
from typing import TYPE_CHECKING

from geo_router.continuation import StreamState
from geo_router.upstream import (
    TRANSPORT_ERRORS,
    Primed,
    parse_events,
    split_events,
    translate_error,
)
from servekit.errors import ServeError, UpstreamUnavailable, error_from_body
from servekit.sse import DONE_FRAME, SSEDecoder, encode_error

if TYPE_CHECKING:
    from geo_router.dispatch import Dispatcher, Opened, RouteRequest

__all__ = ["relay"]

_DONE = b"data: [DONE]"


async def relay(
    dispatcher: Dispatcher, req: RouteRequest, opened: Opened, state: StreamState
) -> AsyncGenerator[bytes, None]:
    """Client bytes for the stream; ``state`` collects what was said."""
    metrics, tracker = dispatcher.metrics, dispatcher.tracker
    primed, cand = opened.primed, opened.cand
    region = req.region.region
    tried = [cand.id]
    rewriting = False
    sent_before = 0
    released = False
    try:
        now = time.perf_counter()
        if primed.head:
            state.record(primed.head)
            yield primed.head
            now = time.perf_counter()
        # Accounting waits until the first bytes are on their way to the client.
        metrics.ttft.labels(cand.tier, region).observe(now - req.arrived)
        metrics.overhead.observe(max(0.0, now - req.arrived - primed.ttft_s))
        metrics.decisions.labels(cand.tier, region, opened.reason).inc()
        itl = metrics.itl.labels(cand.tier, region)
        last = now
        while True:
            pump = _Pump(primed, state, rewriting, sent_before)
            async for out in pump.run():
                yield out
                now = time.perf_counter()
                itl.observe(now - last)
                last = now
            error = pump.error
            tracker.release(cand.id)
            released = True
            if error is None:
                await primed.finish()
                return
            # The upstream died mid-stream: continue elsewhere, or end cleanly.
            tracker.failure(cand.id)
            await primed.aclose()
            state.sync()
            nxt = await dispatcher.resume(req, state, tried)
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
            out = _rewrite(state, primed, primed.head, sent_before)
            if out:
                yield out
    finally:
        await primed.aclose()
        if not released:
            tracker.release(cand.id)
            tracker.abandoned(cand.id)
        metrics.e2e.labels(opened.cand.tier, region).observe(time.perf_counter() - req.arrived)


def _rewrite(state: StreamState, primed: Primed, complete: bytes, sent_before: int) -> bytes:
    """A continuation's complete events as frames of the original stream."""
    events, done = parse_events(primed.decoder, complete)
    frames = []
    for event in events:
        frame = state.splice(event, sent_before)
        if frame:
            frames.append(frame)
    out = b"".join(frames)
    return out + DONE_FRAME if done else out


class _Pump:
    """Reads the rest of one upstream stream; ``error`` is set if it broke off."""

    def __init__(self, primed: Primed, state: StreamState, rewriting: bool, sent_before: int):
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
        try:
            # Idle gaps are bounded by the session's sock_read timeout.
            async for chunk in primed.chunks:
                complete, pending = split_events(pending + chunk)
                if not complete:
                    continue
                if b'"error"' in complete:
                    _raise_error_event(complete)
                if self._rewriting:
                    yield _rewrite(state, primed, complete, self._sent_before)
                else:
                    state.record(complete)
                    yield complete
                if _DONE in complete:
                    return
            state.sync()
            if state.finish_reason is not None:
                yield DONE_FRAME  # finished without [DONE]: close it properly
                return
            raise UpstreamUnavailable(f"upstream {primed.url} ended the stream early")
        except (*TRANSPORT_ERRORS, ServeError) as exc:
            self.error = translate_error(exc, primed.url)


def _raise_error_event(complete: bytes) -> None:
    events, _ = parse_events(SSEDecoder(), complete)
    for event in events:
        if isinstance(event.get("error"), dict):
            raise error_from_body(502, event)
