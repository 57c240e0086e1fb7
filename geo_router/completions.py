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
import secrets
import time
from collections.abc import AsyncGenerator
from typing import TYPE_CHECKING, Any

from geo_router.bodycheck import validated_body
from geo_router.continuation import Kind, StreamState, assemble
from geo_router.conversation import estimate_prompt_tokens
from geo_router.dispatch import RouteRequest
from geo_router.relay import relay as relay_stream
from servekit.asgi import (
    ClientGone,
    DisconnectWatch,
    Receive,
    Scope,
    Send,
    raw_headers,
    read_body,
    send_json,
)
from servekit.errors import ServeError
from servekit.sse import DONE_FRAME

if TYPE_CHECKING:
    from geo_router.app import RouterState

__all__ = ["CompletionEndpoints", "request_id", "validated_body"]

PATHS: dict[str, Kind] = {"/v1/chat/completions": "chat", "/v1/completions": "completion"}

# Request ids: a random per-process prefix and a counter (uuid4 reads the OS
# entropy pool on every call, a system call on the request path).
_ID_PREFIX = "req-" + secrets.token_hex(6)
_ID_COUNTER = itertools.count(1)


def request_id() -> str:
    return f"{_ID_PREFIX}{next(_ID_COUNTER):012x}"


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
            await send_json(send, 405, err, {"Allow": "POST"})
            return
        state: RouterState = self.app.state.router
        watch: DisconnectWatch | None = None
        try:
            headers = {k.decode("latin-1"): v.decode("latin-1") for k, v in scope["headers"]}
            raw = await read_body(
                receive, state.settings.max_body_bytes, headers.get("content-length")
            )
            watch = DisconnectWatch(receive)
            await self._route(state, kind, scope, headers, raw, send, watch)
        except ClientGone:
            return
        except ServeError as exc:
            if exc.status < 500:
                state.metrics.rejected.labels(str(exc.status)).inc()
            if watch is not None:
                watch.finish()
            await send_json(send, exc.status, exc.body(), exc.headers())
        except asyncio.CancelledError:
            if watch is None or not watch.gone():
                raise
        finally:
            if watch is not None:
                watch.close()

    async def _route(
        self,
        state: RouterState,
        kind: Kind,
        scope: Scope,
        headers: dict[str, str],
        raw: bytes,
        send: Send,
        watch: DisconnectWatch,
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
            "X-Route-Cached-Tokens": str(opened.cand.cached_tokens),
            "X-Request-Id": req_id,
        }
        if opened.cand.trim is not None:
            route_headers["X-Route-Trimmed"] = opened.cand.trim.header()
        stream = StreamState(kind)
        relay = relay_stream(state.dispatcher, req, opened, stream)
        try:
            if body["stream"]:
                await self._stream(relay, route_headers, send, watch)
                return
            async for _ in relay:
                pass
        finally:
            await relay.aclose()
        if stream.error is not None:
            raise stream.error
        watch.finish()
        await send_json(send, 200, assemble(stream), route_headers)

    async def _stream(
        self,
        relay: AsyncGenerator[bytes, None],
        headers: dict[str, str],
        send: Send,
        watch: DisconnectWatch,
    ) -> None:
        headers["Cache-Control"] = "no-cache"
        raw = raw_headers(headers, b"text/event-stream; charset=utf-8")
        await send({"type": "http.response.start", "status": 200, "headers": raw})
        ended = False
        async for chunk in relay:
            if ended:
                continue  # nothing follows [DONE]; the relay is drained for its bookkeeping
            # The chunk that carries [DONE] also closes the response: one write, not two.
            ended = chunk.endswith(DONE_FRAME)
            if ended:
                watch.finish()
            await send({"type": "http.response.body", "body": chunk, "more_body": not ended})
        if not ended:
            watch.finish()
            await send({"type": "http.response.body", "body": b"", "more_body": False})
