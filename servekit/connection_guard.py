"""Server-side limits on what one HTTP connection may hold: slow readers, slow senders, floods.

uvicorn bounds only the idle time between requests on a keep-alive
connection (``timeout_keep_alive``). A client that stops reading a stream
keeps the handler, its engine slot and the upstream request open for as long
as it likes (the write waits on a paused transport forever); a client that
sends a request head one byte a minute, or opens a connection and sends
nothing, holds a socket without end; and nothing caps how many connections
one server holds. :class:`GuardedProtocol` (the services' HTTP protocol,
:class:`~servekit.http_protocol.HeadWithBodyProtocol` plus these guards)
closes each of those, from the transport's own flow-control callbacks:

- **send stall** (``send_stall_s``): when the transport's write buffer is full
  (``pause_writing``: the client has not taken the bytes already sent) and
  stays full this long, the connection is aborted. uvicorn then reports the
  client as gone, so the handler's disconnect watch cancels it and its
  ``finally`` blocks release the slot, the admission and the upstream stream.
  A client reading slowly but steadily never trips it: every drain restarts
  the clock.
- **header time** (``header_timeout_s``): a new connection, and each new
  request on a kept-alive one, must deliver its request line and headers
  within this long; otherwise it gets ``408`` and is closed. uvicorn has no
  such knob (its keep-alive timer stops at the first byte received).
  Refusals of a head (408, 431) close lingering: the answer leaves with a
  FIN and the client's further bytes are dropped for a moment, since closing
  with them unread would reset the connection and lose the answer.
- **header size** (``max_header_bytes``): a request head larger than this gets
  ``431`` and the connection is closed; the parser (llhttp through
  ``httptools``) accepts heads of any size and uvicorn has no knob for it
  (``h11_max_incomplete_event_size`` is for the ``h11`` protocol only).
- **connections** (``max_connections``): above this many open connections a
  request is answered at once with ``503`` in the OpenAI error shape
  (``code: too_many_connections``, ``Retry-After: 1``, ``Connection: close``),
  the same rule as uvicorn's ``limit_concurrency`` but in the services' error
  contract, so a router fails over to another instance.

A body is bounded by each service's ``max_body_bytes`` (413).

Each closing is reported to ``on_close`` with its reason (:data:`CLOSE_REASONS`:
``send_stall``, ``header_timeout``, ``header_too_large``,
``too_many_connections``); the services count them in
``hybrid_connections_closed_total{reason}`` (:mod:`servekit.metrics`).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import ClassVar, Literal, get_args

from servekit.asgi import Receive, Scope, Send, send_json
from servekit.errors import NotReady
from servekit.http_protocol import HeadWithBodyProtocol

__all__ = [
    "CLOSE_REASONS",
    "CloseReason",
    "ConnectionLimits",
    "GuardedProtocol",
    "OnClose",
    "guarded_protocol",
]

log = logging.getLogger(__name__)

_CLOSING = b"\r\ncontent-length: 0\r\nconnection: close\r\n\r\n"
_REQUEST_TIMEOUT = b"HTTP/1.1 408 Request Timeout" + _CLOSING
_HEAD_TOO_LARGE = b"HTTP/1.1 431 Request Header Fields Too Large" + _CLOSING
_LINGER_S = 2.0  # how long a refused client's further bytes are read and dropped

CloseReason = Literal["send_stall", "header_timeout", "header_too_large", "too_many_connections"]
CLOSE_REASONS: tuple[CloseReason, ...] = get_args(CloseReason)
OnClose = Callable[[CloseReason], None]


@dataclass(frozen=True, slots=True)
class ConnectionLimits:
    """The guards' settings; None turns a guard off."""

    send_stall_s: float | None = None
    header_timeout_s: float | None = None
    max_header_bytes: int | None = None
    max_connections: int | None = None


async def _too_many_connections(scope: Scope, receive: Receive, send: Send) -> None:
    refusal = NotReady(
        "the server holds too many connections; retry shortly",
        code="too_many_connections",
        retry_after=1,
    )
    headers = {**refusal.headers(), "Connection": "close"}
    await send_json(send, refusal.status, refusal.body(), headers)


class GuardedProtocol(HeadWithBodyProtocol):
    """The services' HTTP protocol with the guards of :class:`ConnectionLimits`."""

    limits: ClassVar[ConnectionLimits] = ConnectionLimits()
    on_close: ClassVar[OnClose | None] = None

    _stall: asyncio.TimerHandle | None = None
    _head: asyncio.TimerHandle | None = None
    _in_head = False  # a request head is arriving
    _head_bytes = 0  # bytes of it received so far
    _dropping = False  # refused: what the client still sends is read and dropped

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._await_head()

    def data_received(self, data: bytes) -> None:
        if self._dropping:
            return
        if self._in_head:
            self._head_bytes += len(data)
        super().data_received(data)
        # Still inside the head after this chunk: all of it was head bytes.
        cap = self.limits.max_header_bytes
        if self._in_head and cap is not None and self._head_bytes > cap:
            log.info("request head over %d bytes: answered 431", cap)
            self._report("header_too_large")
            self._refuse(_HEAD_TOO_LARGE)

    def connection_lost(self, exc: Exception | None) -> None:
        self._cancel_stall()
        self._cancel_head()
        super().connection_lost(exc)

    # Header time: from the connection (or a request's first byte) to its last header.

    def on_message_begin(self) -> None:
        super().on_message_begin()
        if not self._in_head:
            self._await_head()

    def on_headers_complete(self) -> None:
        self._cancel_head()
        self._in_head = False
        cap = self.limits.max_connections
        if cap is None or len(self.connections) <= cap:
            super().on_headers_complete()
            return
        log.warning("over %d connections: answered 503 too_many_connections", cap)
        self._report("too_many_connections")
        app = self.app
        self.app = _too_many_connections
        try:
            super().on_headers_complete()
        finally:
            self.app = app

    def _report(self, reason: CloseReason) -> None:
        report = type(self).on_close
        if report is not None:
            report(reason)

    def _await_head(self) -> None:
        self._in_head = True
        self._head_bytes = 0
        timeout = self.limits.header_timeout_s
        if timeout is not None:
            self._head = self.loop.call_later(timeout, self._head_too_slow)

    def _cancel_head(self) -> None:
        if self._head is not None:
            self._head.cancel()
            self._head = None

    def _head_too_slow(self) -> None:
        self._head = None
        if self.transport.is_closing():
            return
        log.info("request head not complete after %gs: closed", self.limits.header_timeout_s)
        self._report("header_timeout")
        self._refuse(_REQUEST_TIMEOUT)

    def _refuse(self, answer: bytes) -> None:
        """Answer a request whose head never completed, and close.

        Closing a socket with the client's bytes still unread makes the kernel reset
        the connection, which can destroy the answer before the client reads it; so
        the answer goes out with a FIN and what the client still sends is read and
        dropped for up to ``_LINGER_S`` (a lingering close, as nginx does)."""
        self._cancel_head()
        self._in_head = False
        self._dropping = True
        if self.cycle is None or self.cycle.response_complete:  # no response under way
            self.transport.write(answer)
        if not self.transport.can_write_eof():  # TLS: no half-close
            self.transport.close()
            return
        self.transport.write_eof()
        self.loop.call_later(_LINGER_S, self._close)

    def _close(self) -> None:
        if not self.transport.is_closing():
            self.transport.close()

    # Send stall: the client takes none of the bytes already sent for too long.

    def pause_writing(self) -> None:
        super().pause_writing()
        timeout = self.limits.send_stall_s
        if timeout is not None and self._stall is None:
            self._stall = self.loop.call_later(timeout, self._client_stalled)

    def resume_writing(self) -> None:
        self._cancel_stall()
        super().resume_writing()

    def _cancel_stall(self) -> None:
        if self._stall is not None:
            self._stall.cancel()
            self._stall = None

    def _client_stalled(self) -> None:
        self._stall = None
        log.info(
            "client took no response bytes for %gs: connection aborted", self.limits.send_stall_s
        )
        self._report("send_stall")
        self.transport.abort()  # close() would wait for the unread bytes to leave


def guarded_protocol(
    limits: ConnectionLimits, on_close: OnClose | None = None
) -> type[GuardedProtocol]:
    """The protocol class uvicorn should build, with these limits; ``on_close`` hears
    each connection a guard closes (a service's :class:`~servekit.metrics.GuardMetrics`)."""
    attrs = {"limits": limits, "on_close": staticmethod(on_close) if on_close else None}
    return type("GuardedProtocol", (GuardedProtocol,), attrs)
