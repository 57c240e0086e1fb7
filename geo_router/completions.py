"""The completion endpoints as plain ASGI, in front of the FastAPI app.

``POST /v1/chat/completions`` and ``POST /v1/completions`` carry every token
the router forwards, so they skip FastAPI's middleware, routing and
``StreamingResponse`` task group (about half a millisecond a request here)
and speak ASGI directly. Everything else goes to the FastAPI app, which also
documents these two paths (``geo_router.openapi``).

A client that disconnects cancels the request: a watcher waits on
``receive()`` once the body is read and cancels the handler, whose cleanup
closes the upstream stream.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import secrets
import time
from collections.abc import AsyncGenerator, Awaitable, Callable, MutableMapping
from typing import TYPE_CHECKING, Any

from geo_router.bodycheck import validated_body
from geo_router.continuation import Kind, StreamState, assemble
from geo_router.dispatch import RouteRequest
from geo_router.planner import estimate_prompt_tokens
from geo_router.relay import relay as relay_stream
from servekit.errors import PayloadTooLarge, ServeError
from servekit.sse import DONE_FRAME

if TYPE_CHECKING:
    from geo_router.app import RouterState

__all__ = ["CompletionEndpoints", "read_body", "request_id", "validated_body"]

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]

PATHS: dict[str, Kind] = {"/v1/chat/completions": "chat", "/v1/completions": "completion"}

# Request ids: a random per-process prefix and a counter (uuid4 reads the OS
# entropy pool on every call, a system call on the request path).
_ID_PREFIX = "req-" + secrets.token_hex(6)
_ID_COUNTER = itertools.count(1)


def request_id() -> str:
    return f"{_ID_PREFIX}{next(_ID_COUNTER):012x}"


class _ClientGone(Exception):
    pass


async def read_body(receive: Receive, limit: int, declared: str | None) -> bytes:
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise PayloadTooLarge(f"request body exceeds {limit} bytes")
    chunks: list[bytes] = []
    size = 0
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            raise _ClientGone
        chunk = message.get("body", b"")
        size += len(chunk)
        if size > limit:
            raise PayloadTooLarge(f"request body exceeds {limit} bytes")
        chunks.append(chunk)
        if not message.get("more_body", False):
            return b"".join(chunks)


def _raw_headers(headers: dict[str, str], content_type: bytes) -> list[tuple[bytes, bytes]]:
    out = [(b"content-type", content_type)]
    out += [(k.lower().encode(), v.encode("latin-1", "replace")) for k, v in headers.items()]
    return out


async def _send_json(
    send: Send, status: int, body: Any, headers: dict[str, str] | None = None
) -> None:
    payload = json.dumps(body, ensure_ascii=False, separators=(",", ":")).encode()
    raw = _raw_headers(headers or {}, b"application/json")
    raw.append((b"content-length", str(len(payload)).encode()))
    await send({"type": "http.response.start", "status": status, "headers": raw})
    await send({"type": "http.response.body", "body": payload})


class CompletionEndpoints:
    """ASGI app: the two completion paths here, everything else to ``app``."""

    def __init__(self, app: Any) -> None:
        self.app = app  # the FastAPI app; its lifespan puts RouterState on app.state

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        kind = PATHS.get(scope.get("path", "")) if scope["type"] == "http" else None
        if kind is None:
            await self.app(scope, receive, send)
            return
        if scope["method"] != "POST":
            err = {"error": {"message": "use POST", "type": "invalid_request_error"}}
            await _send_json(send, 405, err, {"Allow": "POST"})
            return
        state: RouterState = self.app.state.router
        task = asyncio.current_task()
        assert task is not None
        phase = {"body": True, "finished": False, "gone": False}

        async def watch() -> None:
            message = await receive()
            if message["type"] == "http.disconnect" and not phase["finished"]:
                phase["gone"] = True
                task.cancel()

        watcher: asyncio.Task[None] | None = None
        try:
            headers = {k.decode("latin-1"): v.decode("latin-1") for k, v in scope["headers"]}
            raw = await read_body(
                receive, state.settings.max_body_bytes, headers.get("content-length")
            )
            watcher = asyncio.create_task(watch())
            await self._route(state, kind, scope, headers, raw, send, phase)
        except _ClientGone:
            return
        except ServeError as exc:
            if exc.status < 500:
                state.metrics.rejected.labels(str(exc.status)).inc()
            phase["finished"] = True
            await _send_json(send, exc.status, exc.body(), exc.headers())
        except asyncio.CancelledError:
            if not phase["gone"]:
                raise
            task.uncancel()
        finally:
            phase["finished"] = True
            if watcher is not None:
                watcher.cancel()

    async def _route(
        self,
        state: RouterState,
        kind: Kind,
        scope: Scope,
        headers: dict[str, str],
        raw: bytes,
        send: Send,
        phase: dict[str, bool],
    ) -> None:
        arrived = time.perf_counter()
        tenant = state.auth.authenticate(headers.get("authorization"))
        body = validated_body(kind, raw)
        limit = body.get("max_completion_tokens") or body.get("max_tokens")
        budget = limit if isinstance(limit, int) else state.settings.routing.default_max_tokens
        state.limiter.check(tenant, estimate_prompt_tokens(body) + budget)
        client = scope.get("client")
        region = state.resolver.resolve(client[0] if client else None, headers)
        req_id = headers.get("x-request-id") or request_id()
        user = body.get("user")
        sticky = user if isinstance(user, str) and user else req_id
        decision = state.planner.plan(body, region, sticky)
        upstream = dict(body)
        upstream["stream"] = True
        if not body["stream"]:
            upstream["stream_options"] = {"include_usage": True}
        up_headers = {
            "content-type": "application/json",
            "accept": "text/event-stream",
            "x-priority": tenant.priority,
            "x-request-id": req_id,
        }
        path = scope["path"]
        req = RouteRequest(body, kind, path, region, sticky, up_headers, arrived, upstream)
        opened = await state.dispatcher.open(req, decision)
        route_headers = {
            "X-Route-Tier": opened.cand.tier,
            "X-Route-Instance": opened.cand.id,
            "X-Route-Region": opened.cand.region,
            "X-Route-User-Region": region.region,
            "X-Route-Reason": opened.reason,
            "X-Request-Id": req_id,
        }
        stream = StreamState(kind)
        relay = relay_stream(state.dispatcher, req, opened, stream)
        try:
            if body["stream"]:
                await self._stream(relay, route_headers, send, phase)
                return
            async for _ in relay:
                pass
        finally:
            await relay.aclose()
        if stream.error is not None:
            raise stream.error
        phase["finished"] = True
        await _send_json(send, 200, assemble(stream), route_headers)

    async def _stream(
        self,
        relay: AsyncGenerator[bytes, None],
        headers: dict[str, str],
        send: Send,
        phase: dict[str, bool],
    ) -> None:
        headers["Cache-Control"] = "no-cache"
        raw = _raw_headers(headers, b"text/event-stream; charset=utf-8")
        await send({"type": "http.response.start", "status": 200, "headers": raw})
        ended = False
        async for chunk in relay:
            if ended:
                continue  # nothing follows [DONE]; the relay is drained for its bookkeeping
            # The chunk that carries [DONE] also closes the response: one write, not two.
            ended = chunk.endswith(DONE_FRAME)
            phase["finished"] = ended
            await send({"type": "http.response.body", "body": chunk, "more_body": not ended})
        if not ended:
            phase["finished"] = True
            await send({"type": "http.response.body", "body": b"", "more_body": False})
