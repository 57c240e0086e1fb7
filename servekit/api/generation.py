"""Running one generation for an HTTP request: admission, priming, streaming.

The first engine event is awaited *before* the response starts, so anything
that goes wrong early (context overflow, engine failure, a refused upstream)
becomes a plain HTTP error with the right status instead of a broken stream.
After the first byte, failures end the stream with an OpenAI error event and
``[DONE]``, and so does the stream deadline (``ServingCore.stream_deadline_s``).
The admission ticket is held until the stream ends, however it ends.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

from servekit.admission import Ticket
from servekit.api.core import ServingCore
from servekit.api.frames import FrameBuilder
from servekit.api.serving_trace import ServingTrace
from servekit.asgi import Send, raw_headers, send_json
from servekit.engine.protocol import (
    Engine,
    Finish,
    GenerationEvent,
    GenerationRequest,
    LoadReport,
    TextDelta,
    prefill_backlog_ahead_ms,
    slot_hold_ms,
    uncached_tokens,
)
from servekit.errors import EngineFailure, QueueFull, ServeError, StreamDeadlineExceeded
from servekit.sse import DONE_FRAME, encode_error
from servekit.stream_deadline import stream_deadline

__all__ = ["serve_generation"]


@dataclass
class _Clock:
    """Per-request latency bookkeeping for the metrics."""

    core: ServingCore
    arrival: float
    first: float | None = None
    last: float | None = None
    tokens: int = field(default=0)
    trace: ServingTrace | None = None  # tracing on: the request's stages as spans

    def on_delta(self, delta: TextDelta) -> None:
        now = time.perf_counter()
        m = self.core.metrics
        if self.first is None:
            if not delta.text and delta.tokens == 0:
                return
            self.first = now
            m.ttft.observe(now - self.arrival)
            if self.trace is not None:
                self.trace.first_token()
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
        if self.trace is not None:
            self.trace.finished(finish)


def _record_failure(core: ServingCore, exc: ServeError) -> None:
    if isinstance(exc, QueueFull):
        core.metrics.outcome("rejected")
    elif isinstance(exc, StreamDeadlineExceeded):  # the caller's doing, not the version's
        core.metrics.outcome("deadline")
    elif exc.status < 500:
        core.metrics.outcome("client_error")
    else:
        core.metrics.outcome("error")
        core.requests_failed += 1


async def _close(events: AsyncIterator[GenerationEvent], ticket: Ticket) -> None:
    """Close the engine stream and free the slot, even while being cancelled."""
    try:
        await asyncio.shield(events.aclose())  # type: ignore[attr-defined]
    finally:
        ticket.release()


def own_prefill_ms(tokens: int | None, report: LoadReport) -> float:
    """How long the engine would take to prefill ``tokens`` uncached prompt tokens
    (:func:`_prefill_tokens`) at its measured rate; 0 when unknown or no rate is."""
    rate = report.prefill_tokens_per_s
    if not tokens or not rate:
        return 0.0
    return tokens / rate * 1000.0


def _prefill_tokens(engine: Engine, gen: GenerationRequest) -> int | None:
    """``gen``'s uncached prompt tokens: the engine's own count where it knows what its
    slots hold, else the router's (``X-Prefill-Tokens``)."""
    tokens = uncached_tokens(engine, gen)
    return gen.prefill_tokens if tokens is None else tokens


def _observe_for(core: ServingCore, gen: GenerationRequest) -> tuple[float, int | None]:
    """Hand admission the engine's figures as this request meets them; its own
    prefill in ms and its uncached prompt tokens. The backlog ahead is the one
    this request waits behind where the engine prefills shortest first (a short
    question does not wait for a long document admitted before it), else all of it."""
    engine = core.engines.current()
    tokens = _prefill_tokens(engine, gen)
    ahead = None if tokens is None else prefill_backlog_ahead_ms(engine, tokens)
    report = core.observe_engine(backlog_ms=ahead)
    return own_prefill_ms(tokens, report), tokens


async def serve_generation(
    core: ServingCore,
    gen: GenerationRequest,
    send: Send,
    *,
    stream: bool,
    include_usage: bool,
    arrival: float,
    trace: ServingTrace | None = None,
) -> None:
    """Admit, prime and answer one generation on ``send``.

    A client that leaves cancels the calling task (:class:`DisconnectWatch`);
    whatever it was waiting on (the queue, the first token, the socket), the
    ticket is released and the engine stream closed. The answer's
    ``Server-Timing`` header gives its ``queue`` wait and its ``prefill``
    (admission to the engine's first event).
    """
    own, hold = 0.0, None
    admission = core.admission
    if admission.ttft_budget_ms is not None:
        # The prediction needs the engine's backlog and prefill rate of this moment;
        # and, until the engine runs it, how long it should hold its slot.
        own, tokens = _observe_for(core, gen)
        if tokens is not None:
            hold = slot_hold_ms(core.engines.current(), tokens, gen.sampling.max_tokens)
        if trace is not None:
            trace.predicted(admission.predicted_wait_ms(), own)
    spent = float(gen.waited_ms)
    try:
        ticket = admission.try_acquire(gen.priority, own, hold, spent) or await admission.acquire(
            gen.priority, own, hold, spent
        )
    except ServeError as exc:
        _record_failure(core, exc)
        raise
    except asyncio.CancelledError:
        core.metrics.outcome("cancelled")
        raise
    if ticket.queue_time > 0.0 and core.admission.ttft_budget_ms is not None:
        # Its price may have changed while it queued (servekit.admission: recheck).
        try:
            core.admission.recheck(ticket, own, _observe_for(core, gen)[0])
        except ServeError as exc:
            _record_failure(core, exc)
            raise
    core.metrics.queue_time.observe(ticket.queue_time)
    admitted = time.perf_counter()
    if trace is not None:
        trace.admitted(ticket.queue_time)
    engine = core.engines.current()
    events = engine.generate(gen)
    try:
        first = await anext(events)
    except asyncio.CancelledError:
        await _close(events, ticket)
        core.metrics.outcome("cancelled")
        raise
    except ServeError as exc:
        await _close(events, ticket)
        _record_failure(core, exc)
        raise
    except StopAsyncIteration:
        await _close(events, ticket)
        failure = EngineFailure("engine produced no output")
        _record_failure(core, failure)
        raise failure from None

    prefill_s = time.perf_counter() - admitted
    admission.first_token(ticket, (time.perf_counter() - arrival) * 1000.0)
    frames = FrameBuilder(gen.kind, gen.request_id, engine.model_name, int(time.time()))
    clock = _Clock(core, arrival, trace=trace)
    timing = f"queue;dur={ticket.queue_time * 1e3:.2f}, prefill;dur={prefill_s * 1e3:.2f}"
    headers = {"X-Request-Id": gen.request_id, "Server-Timing": timing}
    version = core.version  # not engine.load(): that builds a whole report per request
    if version:
        headers["X-Model-Version"] = version
    if stream:
        headers.update({"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})
        await send(
            {
                "type": "http.response.start",
                "status": 200,
                "headers": raw_headers(headers, b"text/event-stream; charset=utf-8"),
            }
        )
        await _stream(core, frames, clock, first, events, ticket, include_usage, send)
        return
    try:
        async with stream_deadline(arrival, core.stream_deadline_s):
            text, finish = await _collect(clock, first, events)
    except asyncio.CancelledError:
        core.metrics.outcome("cancelled")
        raise
    except ServeError as exc:
        _record_failure(core, exc)
        raise
    finally:
        await _close(events, ticket)
    await send_json(send, 200, frames.whole(text, finish), headers)


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
    send: Send,
) -> None:
    done = False

    async def body(chunk: bytes, more: bool = True) -> None:
        await send({"type": "http.response.body", "body": chunk, "more_body": more})

    try:
        async with stream_deadline(clock.arrival, core.stream_deadline_s):
            role = frames.role()
            if role is not None:
                await body(role)
            event = first
            while True:
                if isinstance(event, Finish):
                    clock.on_finish(event)
                    done = True
                    # Free the slot before the client can see the end: its next
                    # request may follow at once, and a queue still counting this
                    # one is not idle (a long prompt was refused at one at a time).
                    ticket.release()
                    tail = frames.finish(event.reason)
                    if include_usage:
                        tail += frames.usage(event)
                    await body(tail + DONE_FRAME, more=False)
                    return
                clock.on_delta(event)
                if event.text:
                    await body(frames.delta(event.text))
                try:
                    event = await anext(events)
                except StopAsyncIteration:
                    raise EngineFailure("engine stream ended without a finish") from None
    except ServeError as exc:
        if not done:  # else finished and counted; the deadline cut its last write short
            _record_failure(core, exc)
        done = True
        await body(encode_error(exc) + DONE_FRAME, more=False)
    finally:
        if not done:
            core.metrics.outcome("cancelled")
        await _close(events, ticket)
