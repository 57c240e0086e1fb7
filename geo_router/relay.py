"""Relaying one upstream stream's bytes, and rewriting a continuation's events.

Upstream SSE bytes pass through untouched, cut at event boundaries so a
failure never leaves half an event with the client. The hot path does no
JSON work: complete events are kept raw in the :class:`StreamState` and only
parsed when something needs their content (a continuation, a non-streamed
answer, an event that mentions ``"error"``). A continuation's events are
rewritten into the original stream (the slow path, taken once per failure).
What happens when a stream breaks is ``geo_router.routed``'s business.
"""

from __future__ import annotations

from collections.abc import AsyncIterator

from geo_router.continuation import StreamState
from geo_router.upstream import (
    TRANSPORT_ERRORS,
    Primed,
    parse_events,
    split_events,
    translate_error,
)
from servekit.errors import ServeError, error_from_body, upstream_failure
from servekit.sse import DONE_FRAME, SSEDecoder

__all__ = ["Pump", "rewrite"]

_DONE = b"data: [DONE]"


def rewrite(state: StreamState, primed: Primed, complete: bytes, sent_before: int) -> bytes:
    """A continuation's complete events as frames of the original stream."""
    events, done = parse_events(primed.decoder, complete)
    frames = []
    for event in events:
        frame = state.splice(event, sent_before)
        if frame:
            frames.append(frame)
    out = b"".join(frames)
    return out + DONE_FRAME if done else out


class Pump:
    """Reads the rest of one upstream stream; ``error`` is set if it broke off.

    ``sent_before`` (the tokens the client had before this upstream took over)
    is set for a continuation, whose events are rewritten; ``None`` passes bytes through.
    """

    def __init__(self, primed: Primed, state: StreamState, sent_before: int | None) -> None:
        self._primed = primed
        self._state = state
        self._sent_before = sent_before
        self.error: ServeError | None = None

    async def run(self) -> AsyncIterator[bytes]:
        primed, state, sent_before = self._primed, self._state, self._sent_before
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
                if sent_before is not None:
                    yield rewrite(state, primed, complete, sent_before)
                else:
                    state.record(complete)
                    yield complete
                if _DONE in complete:
                    return
            state.sync()
            if state.finish_reason is not None:
                yield DONE_FRAME  # finished without [DONE]: close it properly
                return
            raise upstream_failure("broken", primed.url, "the stream ended early")
        except (*TRANSPORT_ERRORS, ServeError) as exc:
            self.error = translate_error(exc, primed.url)


def _raise_error_event(complete: bytes) -> None:
    events, _ = parse_events(SSEDecoder(), complete)
    for event in events:
        if isinstance(event.get("error"), dict):
            raise error_from_body(502, event)
