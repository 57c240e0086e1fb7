"""The completion endpoints: ``POST /v1/chat/completions`` and ``POST /v1/completions``.

They carry every token the router forwards, so they are plain ASGI behind
servekit's front door (``servekit.api.endpoints``: body limit, 405, the
OpenAI error shape, disconnects), not FastAPI routes; the FastAPI app
documents them (``geo_router.openapi``). :func:`route_completion` takes a
body through :func:`~geo_router.state.intake`, opens a
:class:`~geo_router.routed.RoutedStream` and writes it out. Every answer
carries its stages as ``Server-Timing`` (``geo_router.stages``); with
tracing on, the request is one ``router.request`` span (``geo_router.spans``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from geo_router.continuation import Kind, assemble, without_usage
from geo_router.feedback import Served
from geo_router.request_ids import CLIENT_ID_HEADER
from geo_router.routed import RoutedStream
from geo_router.state import Intake, RouterState, intake
from servekit.asgi import DisconnectWatch, Scope, Send, raw_headers, send_json
from servekit.errors import StreamDeadlineExceeded
from servekit.sse import DONE_FRAME, encode_error
from servekit.stream_deadline import stream_deadline
from servekit.tracing import ending, mark_failed

if TYPE_CHECKING:
    from opentelemetry.trace import Span

__all__ = ["route_completion"]


async def route_completion(
    state: RouterState, scope: Scope, kind: Kind, raw: bytes, send: Send, watch: DisconnectWatch
) -> None:
    """Route one completion request and answer it (errors raise ``ServeError``)."""
    headers = {k.decode("latin-1"): v.decode("latin-1") for k, v in scope["headers"]}
    tracing = state.routing.tracing
    if not tracing.enabled:
        await _route(state, scope, kind, raw, headers, send, watch, None)
        return
    span = tracing.start(
        "router.request", headers=headers, server=True, attributes={"http.route": scope["path"]}
    )
    with ending(span):
        await _route(state, scope, kind, raw, headers, send, watch, span)


async def _route(
    state: RouterState,
    scope: Scope,
    kind: Kind,
    raw: bytes,
    headers: dict[str, str],
    send: Send,
    watch: DisconnectWatch,
    span: Span | None,
) -> None:
    client = scope.get("client")
    peer = client[0] if client else None
    taken = await intake(state, kind, scope["path"], raw, headers, peer, span=span)
    with state.limiter.in_flight(taken.tenant):
        await _serve(state, taken, send, watch, span)


async def _serve(
    state: RouterState, taken: Intake, send: Send, watch: DisconnectWatch, span: Span | None
) -> None:
    req = taken.request
    stream = RoutedStream(state.routing, state.planner, req, taken.decision)
    await stream.open()
    taken.stages.mark("upstream")
    cand = stream.cand
    assert cand is not None
    route_headers = {
        "X-Route-Tier": cand.tier,
        "X-Route-Instance": cand.id,
        "X-Route-Region": cand.region,
        "X-Route-User-Region": req.region.region,
        "X-Route-Reason": stream.reason,
        "X-Request-Id": req.headers["x-request-id"],
        "Server-Timing": taken.stages.server_timing(),
    }
    if taken.tenant.operator:  # what an instance holds is another tenant's business
        route_headers["X-Route-Cached-Tokens"] = str(cand.cached_tokens)
        # The primed candidate's predicted median TTFT there (what a client compares
        # with the TTFT it saw: hybrid-llm bench reports the predictor's error from it);
        # operators only too, since a cached prompt is predicted faster.
        route_headers["X-Route-Predicted-Ttft-Ms"] = f"{cand.ttft_ms:.0f}"
        if cand.ttft_p90_ms is not None:  # the instance's model has learned
            route_headers["X-Route-Predicted-Ttft-P90-Ms"] = f"{cand.ttft_p90_ms:.0f}"
        route_headers["X-Route-Prediction"] = cand.prediction_header()
    if span is not None:
        span.set_attributes(
            {
                "request.id": req.headers["x-request-id"],
                "route.instance": cand.id,
                "route.tier": cand.tier,
                "route.reason": stream.reason,
                "route.stream": bool(req.body["stream"]),
            }
        )
    client_id = req.headers.get(CLIENT_ID_HEADER)
    if client_id is not None:
        route_headers["X-Client-Request-Id"] = client_id
    cls = taken.decision.classification
    if cls is not None:
        # Its own header: X-Route-Reason stays one word, which clients count by.
        route_headers["X-Route-Task"] = (
            f"{cls.task}; p={cls.task_score:.2f}; gap={cls.score:.2f}; rule={cls.rule}"
        )
    if cand.trim is not None:
        route_headers["X-Route-Trimmed"] = cand.trim.header()
    deadline = taken.tenant.stream_deadline_s or state.settings.server.stream_deadline_s
    try:
        if req.body["stream"]:
            options = req.body.get("stream_options")
            asked = isinstance(options, dict) and options.get("include_usage") is True
            await _stream(
                stream,
                route_headers,
                send,
                watch,
                hide_usage=not asked,
                arrival=req.arrived,
                deadline=deadline,
            )
            return
        async with stream_deadline(req.arrived, deadline):
            async for _ in stream:
                pass
    finally:
        await stream.aclose()
        state.metrics.observe_stages(taken.stages.spans())  # off the path to the first byte
        transcript = stream.transcript
        transcript.sync()  # parses what was recorded: the answer's id and usage
        await state.limiter.settle(taken.tenant, taken.charged_tokens, transcript.usage)
        info = cand.state.info
        task = cls.task if cls is not None else "-"
        served = Served(req.tenant or "-", cand.tier, info.model, info.version or "-", task)
        state.feedback.served((transcript.id or "", req.headers["x-request-id"]), served)
        if span is not None:
            span.set_attribute("route.continuations", transcript.continued)
            span.set_attribute("route.completion_tokens", transcript.tokens)
            if transcript.error is not None:
                mark_failed(span, transcript.error)
    if stream.transcript.error is not None:
        raise stream.transcript.error
    watch.finish()
    await send_json(send, 200, assemble(stream.transcript), route_headers)


async def _stream(
    chunks: RoutedStream,
    headers: dict[str, str],
    send: Send,
    watch: DisconnectWatch,
    *,
    hide_usage: bool,
    arrival: float,
    deadline: float | None,
) -> None:
    """Relay the stream within its ``deadline`` (seconds from the request's arrival);
    past it the client's last event is the error and ``[DONE]`` (the caller's
    ``finally`` gives up the upstream and settles the tenant's tokens)."""
    headers["Cache-Control"] = "no-cache"
    raw = raw_headers(headers, b"text/event-stream; charset=utf-8")
    await send({"type": "http.response.start", "status": 200, "headers": raw})
    ended = False
    try:
        async with stream_deadline(arrival, deadline):
            async for chunk in chunks:
                if ended:
                    continue  # nothing follows [DONE]; drained for its bookkeeping
                if hide_usage:  # asked upstream for the limiter's sake, not the client's
                    chunk = without_usage(chunk)
                    if not chunk:
                        continue
                # The chunk that carries [DONE] also closes the response: one write, not two.
                last = chunk.endswith(DONE_FRAME)
                if last:
                    watch.finish()
                await send({"type": "http.response.body", "body": chunk, "more_body": not last})
                ended = last
    except StreamDeadlineExceeded as exc:
        if ended:
            return  # the client has its whole answer; only the bookkeeping was cut short
        chunks.transcript.error = exc
        watch.finish()
        frame = encode_error(exc) + DONE_FRAME
        await send({"type": "http.response.body", "body": frame, "more_body": False})
        return
    if not ended:
        watch.finish()
        await send({"type": "http.response.body", "body": b"", "more_body": False})
