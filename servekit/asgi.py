"""Plain-ASGI building blocks for the hot endpoints of every service.

The completion endpoints carry every token a service streams, so they skip
FastAPI's routing, dependency injection and ``StreamingResponse`` task group
(about a millisecond a request on a small CPU) and speak ASGI directly with
these helpers. One watcher per request turns a client disconnect into a
cancellation of the handler, whatever it is waiting on (queue, first token,
a slow socket), so cleanup runs in ordinary ``finally`` blocks.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

from servekit.errors import PayloadTooLarge

__all__ = [
    "ASGIApp",
    "ClientGone",
    "DisconnectWatch",
    "Message",
    "Receive",
    "Scope",
    "Send",
    "header",
    "raw_headers",
    "read_body",
    "replaying",
    "send_json",
]

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]


class ClientGone(Exception):
    """The client closed the connection; there is nobody to answer."""


def header(scope: Scope, name: bytes) -> str | None:
    """One request header (``name`` in lower case), or None."""
    for key, value in scope.get("headers", ()):
        if key == name:
            return bytes(value).decode("latin-1")
    return None


async def read_body(receive: Receive, limit: int, declared: str | None) -> bytes:
    """The whole request body, refusing more than ``limit`` bytes (413).

    A declared Content-Length over the limit fails before reading; chunked
    uploads are counted as they arrive.
    """
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise PayloadTooLarge(f"request body exceeds {limit} bytes")
    chunks: list[bytes] = []
    size = 0
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            raise ClientGone
        chunk = message.get("body", b"")
        size += len(chunk)
        if size > limit:
            raise PayloadTooLarge(f"request body exceeds {limit} bytes")
        chunks.append(chunk)
        if not message.get("more_body", False):
            return chunks[0] if len(chunks) == 1 else b"".join(chunks)


def replaying(raw: bytes, receive: Receive) -> Receive:
    """A ``receive`` that yields the already-read body ``raw`` once, then the real one."""
    replayed = False

    async def replay() -> Message:
        nonlocal replayed
        if not replayed:
            replayed = True
            return {"type": "http.request", "body": raw, "more_body": False}
        return await receive()

    return replay


def raw_headers(headers: dict[str, str], content_type: bytes) -> list[tuple[bytes, bytes]]:
    out = [(b"content-type", content_type)]
    out += [(k.lower().encode(), v.encode("latin-1", "replace")) for k, v in headers.items()]
    return out


async def send_json(
    send: Send, status: int, body: Any, headers: dict[str, str] | None = None
) -> None:
    """A whole JSON response (the same bytes Starlette's JSONResponse writes)."""
    payload = json.dumps(body, ensure_ascii=False, separators=(",", ":")).encode()
    raw = raw_headers(headers or {}, b"application/json")
    raw.append((b"content-length", str(len(payload)).encode()))
    await send({"type": "http.response.start", "status": status, "headers": raw})
    await send({"type": "http.response.body", "body": payload})


class DisconnectWatch:
    """Cancels the current task if the client disconnects before ``finish()``.

    Start it once the body is read (the watcher consumes ``receive``). A
    handler that catches the resulting ``CancelledError`` asks :meth:`gone`
    whether it was the client (then it uncancels and returns) or a real
    cancellation (then it re-raises).
    """

    def __init__(self, receive: Receive) -> None:
        task = asyncio.current_task()
        assert task is not None, "DisconnectWatch needs a running task"
        self._task = task
        self._receive = receive
        self._finished = False
        self._gone = False
        self._watcher = asyncio.ensure_future(self._watch())

    async def _watch(self) -> None:
        while not self._finished:
            message = await self._receive()
            if message["type"] == "http.disconnect":
                if not self._finished:
                    self._gone = True
                    self._task.cancel()
                return

    def finish(self) -> None:
        """The response is complete: a disconnect from now on is ordinary."""
        self._finished = True

    def gone(self) -> bool:
        """True (once) if the client left and this watch cancelled the task."""
        if not self._gone:
            return False
        self._gone = False
        self._task.uncancel()
        return True

    def close(self) -> None:
        self._finished = True
        self._watcher.cancel()
