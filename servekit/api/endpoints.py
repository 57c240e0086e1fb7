"""The front door of every service: the completion endpoints as plain ASGI.

``POST /v1/chat/completions`` and ``POST /v1/completions`` are answered here
without FastAPI's routing, dependency injection, validation layer or
``StreamingResponse`` task group: about a millisecond less time to first
token per request on a small CPU. Every other request goes on to the FastAPI
app, with its body bounded the same way (413, with ``Connection: close``: the
rest of the upload is not read) and replayed. The FastAPI app still documents
these two paths (:func:`servekit.api.routes.build_serving_app`).

What a completion request *does* is a :data:`CompletionHandler`: a serving
instance runs its engine (the default, :func:`serve_completion`), the geo
router routes it. The door around it is the same for all: a disconnect
cancels the handler, a :class:`~servekit.errors.ServeError` raised before the
response started is rendered in the OpenAI shape, anything else is a 500 in
that shape, and ``on_error`` (metrics) sees every error it renders.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import replace
from typing import Literal

from servekit.api.core import ServingCore, core_of
from servekit.api.generation import serve_generation
from servekit.api.serving_trace import ServingTrace
from servekit.asgi import (
    ASGIApp,
    ClientGone,
    DisconnectWatch,
    Message,
    Receive,
    Scope,
    Send,
    header,
    read_body,
    replaying,
    send_json,
)
from servekit.engine.protocol import GenerationRequest, Priority
from servekit.errors import ServeError, error_body
from servekit.tracing import ending
from servekit.wire import ChatCompletionRequest, CompletionRequest, new_id, parse_request

__all__ = ["PATHS", "CompletionEndpoints", "CompletionHandler", "Kind", "serve_completion"]

log = logging.getLogger(__name__)

Kind = Literal["chat", "completion"]
PATHS: dict[str, Kind] = {"/v1/chat/completions": "chat", "/v1/completions": "completion"}
_BODY_METHODS = frozenset({"POST", "PUT", "PATCH"})

# (scope, kind, raw body, arrival perf_counter, send, disconnect watch)
CompletionHandler = Callable[[Scope, Kind, bytes, float, Send, DisconnectWatch], Awaitable[None]]


async def serve_completion(
    scope: Scope, kind: Kind, raw: bytes, arrival: float, send: Send, watch: DisconnectWatch
) -> None:
    """A serving instance's completion: validate, admit, generate on its engine."""
    core = core_of(scope.get("app"))
    if core.tracing.enabled:
        await _traced_completion(core, scope, kind, raw, arrival, send)
        return
    gen, stream, usage = _generation(core, kind, raw, scope)
    await serve_generation(core, gen, send, stream=stream, include_usage=usage, arrival=arrival)


async def _traced_completion(
    core: ServingCore, scope: Scope, kind: Kind, raw: bytes, arrival: float, send: Send
) -> None:
    """:func:`serve_completion` as one ``serve.request`` span (``servekit.api.serving_trace``)."""
    tracing = core.tracing
    caller = {name: header(scope, name.encode()) for name in ("traceparent", "tracestate")}
    span = tracing.start(
        "serve.request",
        headers={k: v for k, v in caller.items() if v is not None},
        at=arrival,
        server=True,
        attributes={
            "serve.tier": core.metrics.labels["tier"],
            "serve.model": core.engines.current().model_name,
            "serve.model_version": core.version,
            "http.route": scope["path"],
        },
    )
    trace = ServingTrace(tracing, span)
    with ending(span, finished=lambda: bool(trace.finished_at)):
        gen, stream, usage = _generation(core, kind, raw, scope)
        span.set_attributes({"request.id": gen.request_id, "serve.priority": gen.priority.name})
        onward: dict[str, str] = {}
        tracing.inject(span, onward)
        gen = replace(gen, traceparent=onward.get("traceparent"))
        await serve_generation(
            core, gen, send, stream=stream, include_usage=usage, arrival=arrival, trace=trace
        )


class CompletionEndpoints:
    """ASGI middleware: the two completion paths here (``complete``), the rest to ``app``."""

    def __init__(
        self,
        app: ASGIApp,
        max_body_bytes: int,
        complete: CompletionHandler = serve_completion,
        on_error: Callable[[ServeError], None] | None = None,
    ) -> None:
        self.app = app
        self.max_body_bytes = max_body_bytes
        self.complete = complete
        self.on_error = on_error

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        arrival = time.perf_counter()  # TTFT includes parsing and validation
        kind = PATHS.get(scope["path"])
        if kind is not None and scope["method"] != "POST":
            body = error_body("use POST", "invalid_request_error")
            await send_json(send, 405, body, {"Allow": "POST"})
            return
        if scope["method"] not in _BODY_METHODS:
            await self.app(scope, receive, send)
            return
        try:
            raw = await read_body(receive, self.max_body_bytes, header(scope, b"content-length"))
        except ClientGone:
            return
        except ServeError as exc:
            if self.on_error is not None:
                self.on_error(exc)
            await send_json(send, exc.status, exc.body(), {**exc.headers(), "Connection": "close"})
            return
        if kind is None:
            await self.app(scope, replaying(raw, receive), send)
            return
        await self._complete(scope, kind, raw, arrival, receive, send)

    async def _complete(
        self, scope: Scope, kind: Kind, raw: bytes, arrival: float, receive: Receive, send: Send
    ) -> None:
        watch = DisconnectWatch(receive)
        started = False

        async def tracked(message: Message) -> None:
            nonlocal started
            started = True
            await send(message)

        try:
            await self.complete(scope, kind, raw, arrival, tracked, watch)
        except ServeError as exc:
            if exc.status >= 500:
                log.warning("request failed: %r", exc)
            if self.on_error is not None:
                self.on_error(exc)
            if not started:
                watch.finish()
                await send_json(send, exc.status, exc.body(), exc.headers())
        except asyncio.CancelledError:
            if not watch.gone():
                raise
        except Exception:
            log.exception("unhandled error")
            if not started:
                body = error_body("internal server error", "internal_error")
                await send_json(send, 500, body)
        finally:
            watch.close()


def _generation(
    core: ServingCore, kind: Kind, raw: bytes, scope: Scope
) -> tuple[GenerationRequest, bool, bool]:
    """Validate the body against the served model and limits; the engine request."""
    priority = Priority.parse(header(scope, b"x-priority"))
    request_id = header(scope, b"x-request-id")
    prefill = _count(header(scope, b"x-prefill-tokens"))
    waited = _count(header(scope, b"x-waited-ms")) or 0
    if kind == "chat":
        chat = parse_request(ChatCompletionRequest, raw)
        core.check_model(chat.model)
        core.check_token_limits(
            max_tokens=chat.max_tokens, max_completion_tokens=chat.max_completion_tokens
        )
        rid = request_id or new_id("chatcmpl")
        gen = GenerationRequest.from_chat(chat, rid, priority)
        gen = replace(gen, prefill_tokens=prefill, waited_ms=waited)
        return gen, chat.stream, chat.include_usage()
    text = parse_request(CompletionRequest, raw)
    core.check_model(text.model)
    core.check_token_limits(max_tokens=text.max_tokens)
    rid = request_id or new_id("cmpl")
    gen = GenerationRequest.from_completion(text, rid, priority)
    gen = replace(gen, prefill_tokens=prefill, waited_ms=waited)
    return gen, text.stream, text.include_usage()


def _count(value: str | None) -> int | None:
    """A header's non-negative integer; ``None`` when absent or not one (it is a hint)."""
    if value is None or not value.isascii() or not value.isdigit() or len(value) > 9:
        return None
    return int(value)
