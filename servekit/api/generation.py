"""Running one generation for an HTTP request: admission, priming, streaming.

The first engine event is awaited *before* the response starts, so anything
that goes wrong early (context overflow, engine failure, a refused upstream)
becomes a plain HTTP error with the right status instead of a broken stream.
After the first byte, failures end the stream with an OpenAI error event and
``[DONE]``. The admission ticket is held until the stream ends, however it ends.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

import anyio
from fastapi import Request
from fastapi.responses import JSONResponse, Response, StreamingResponse

from servekit.admission import Ticket
from servekit.api.core import ServingCore
from servekit.api.disconnect import ClientGone, unless_disconnected
from servekit.api.frames import FrameBuilder
from servekit.engine.protocol import Finish, GenerationEvent, GenerationRequest, TextDelta
from servekit.errors import EngineFailure, QueueFull, ServeError
from servekit.sse import DONE_FRAME, encode_error

__all__ = ["run_generation"]

_CLIENT_CLOSED = 499  # nginx's convention; nobody reads it, logs do


@dataclass
class _Clock:
    """Per-request latency bookkeeping for the metrics."""

    core: ServingCore
    arrival: float
    first: float | None = None
    last: float | None = None
    tokens: int = field(default=0)

    def on_delta(self, delta: TextDelta) -> None:
        now = time.perf_counter()
        m = self.core.metrics
        if self.first is None:
            if not delta.text and delta.tokens == 0:
                return
            self.first = now
            m.ttft.observe(now - self.arrival)
        elif self.last is not None and delta.tokens > 0:
            gap = (now - self.last) / delta.tokens
            for _ in range(delta.tokens):
                m.itl.observe(gap)
        self.last = now
        self.tokens += delta.tokens

    def on_finish(self, finish: Finish) -> None:
        m = self.core.metrics
        now = time.perf_counter()
        if self.first is None:
            m.ttft.observe(now - self.arrival)
        m.e2e.observe(now - self.arrival)
        m.prompt_tokens.inc(finish.prompt_tokens)
        m.generation_tokens.inc(finish.completion_tokens)
        m.finished(finish.reason)
        m.outcome("ok")
        self.core.requests_ok += 1


def _record_failure(core: ServingCore, exc: ServeError) -> None:
    if isinstance(exc, QueueFull):
        core.metrics.outcome("rejected")
    elif exc.status < 500:
        core.metrics.outcome("client_error")
    else:
        core.metrics.outcome("error")
        core.requests_failed += 1


async def _close(events: AsyncIterator[GenerationEvent], ticket: Ticket) -> None:
    with anyio.CancelScope(shield=True):
        try:
            await events.aclose()  # type: ignore[attr-defined]
        finally:
            ticket.release()


async def run_generation(
    core: ServingCore,
    request: Request,
    gen: GenerationRequest,
    *,
    stream: bool,
    include_usage: bool,
    arrival: float,
) -> Response:
    try:
        # The common case needs no waiting, so no disconnect watcher either.
        ticket = core.admission.try_acquire(gen.priority)
        if ticket is None:
            ticket = await unless_disconnected(request, core.admission.acquire(gen.priority))
    except ClientGone:
        core.metrics.outcome("cancelled")
        return Response(status_code=_CLIENT_CLOSED)
    except ServeError as exc:
        _record_failure(core, exc)
        raise
    core.metrics.queue_time.observe(ticket.queue_time)
    engine = core.engines.current()
    events = engine.generate(gen)
    try:
        first = await unless_disconnected(request, anext(events))
    except ClientGone:
        await _close(events, ticket)
        core.metrics.outcome("cancelled")
        return Response(status_code=_CLIENT_CLOSED)
    except ServeError as exc:
        await _close(events, ticket)
        _record_failure(core, exc)
        raise
    except StopAsyncIteration:
        await _close(events, ticket)
        failure = EngineFailure("engine produced no output")
        _record_failure(core, failure)
        raise failure from None

    frames = FrameBuilder(gen.kind, gen.request_id, engine.model_name, int(time.time()))
    clock = _Clock(core, arrival)
    headers = {"X-Request-Id": gen.request_id}
    version = core.version  # not engine.load(): that builds a whole report per request
    if version:
        headers["X-Model-Version"] = version
    if stream:
        body = _stream(core, frames, clock, first, events, ticket, include_usage)
        headers.update({"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})
        return StreamingResponse(body, media_type="text/event-stream", headers=headers)
    try:
        text, finish = await unless_disconnected(request, _collect(clock, first, events))
    except ClientGone:
        core.metrics.outcome("cancelled")
        return Response(status_code=_CLIENT_CLOSED)
    except ServeError as exc:
        _record_failure(core, exc)
        raise
    finally:
        await _close(events, ticket)
    return JSONResponse(frames.whole(text, finish), headers=headers)


async def _collect(
    clock: _Clock, first: GenerationEvent, events: AsyncIterator[GenerationEvent]
) -> tuple[str, Finish]:
    parts: list[str] = []
    event = first
    while True:
        if isinstance(event, Finish):
            clock.on_finish(event)
            return "".join(parts), event
        clock.on_delta(event)
        parts.append(event.text)
        try:
            event = await anext(events)
        except StopAsyncIteration:
            raise EngineFailure("engine stream ended without a finish") from None


async def _stream(
    core: ServingCore,
    frames: FrameBuilder,
    clock: _Clock,
    first: GenerationEvent,
    events: AsyncIterator[GenerationEvent],
    ticket: Ticket,
    include_usage: bool,
) -> AsyncIterator[bytes]:
    done = False
    try:
        role = frames.role()
        if role is not None:
            yield role
        event = first
        while True:
            if isinstance(event, Finish):
                clock.on_finish(event)
                done = True
                yield frames.finish(event.reason)
                if include_usage:
                    yield frames.usage(event)
                yield DONE_FRAME
                return
            clock.on_delta(event)
            if event.text:
                yield frames.delta(event.text)
            try:
                event = await anext(events)
            except StopAsyncIteration:
                raise EngineFailure("engine stream ended without a finish") from None
    except ServeError as exc:
        done = True
        _record_failure(core, exc)
        yield encode_error(exc)
        yield DONE_FRAME
    finally:
        if not done:
            core.metrics.outcome("cancelled")
        await _close(events, ticket)
