"""The router's HTTP endpoints: OpenAI API, explain, health, readiness, metrics."""

from __future__ import annotations

import json
import time
from typing import TYPE_CHECKING, Any

from fastapi import APIRouter
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse

from geo_router.auth import Tenant
from geo_router.continuation import Kind, StreamState, assemble
from geo_router.dispatch import RouteRequest
from geo_router.openapi import ERROR_RESPONSES, STREAM_RESPONSES, request_body
from geo_router.planner import estimate_prompt_tokens
from geo_router.tracker import Circuit
from servekit.errors import NotReady, PayloadTooLarge
from servekit.wire import ChatCompletionRequest, CompletionRequest, new_id, parse_request

if TYPE_CHECKING:
    from geo_router.app import RouterState

__all__ = ["router"]

router = APIRouter()


def _state(request: Request) -> RouterState:
    state: RouterState = request.app.state.router
    return state


async def _read_body(request: Request, limit: int) -> bytes:
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise PayloadTooLarge(f"request body exceeds {limit} bytes")
    chunks: list[bytes] = []
    size = 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise PayloadTooLarge(f"request body exceeds {limit} bytes")
        chunks.append(chunk)
    return b"".join(chunks)


async def _admit(request: Request, kind: Kind) -> tuple[RouterState, Tenant, dict[str, Any]]:
    """Authenticate, bound, validate: the checks every routed request passes."""
    state = _state(request)
    tenant = state.auth.authenticate(request.headers.get("authorization"))
    raw = await _read_body(request, state.settings.max_body_bytes)
    return state, tenant, _validated(kind, raw)


# JSON Schema counts 2.0 as an integer; the strict wire types do not.
_INT_FIELDS = ("max_tokens", "max_completion_tokens", "n", "seed")


def _validated(kind: Kind, raw: bytes) -> dict[str, Any]:
    """The client's body as a dict (its own fields kept, to forward) once it validates."""
    model = ChatCompletionRequest if kind == "chat" else CompletionRequest
    try:
        body = json.loads(raw)
    except ValueError:
        parse_request(model, raw)  # raises the wire types' invalid_json error
        raise
    if isinstance(body, dict):
        for key in _INT_FIELDS:
            value = body.get(key)
            if isinstance(value, float) and value.is_integer():
                body[key] = int(value)
    parsed = parse_request(model, body)
    out: dict[str, Any] = body  # the wire type accepted it, so it is an object
    out["stream"] = parsed.stream
    return out


async def _route(request: Request, kind: Kind, path: str) -> Response:
    arrived = time.perf_counter()
    state, tenant, body = await _admit(request, kind)
    routing = state.settings.routing
    limit = body.get("max_completion_tokens") or body.get("max_tokens")
    budget = limit if isinstance(limit, int) else routing.default_max_tokens
    state.limiter.check(tenant, estimate_prompt_tokens(body) + budget)
    peer = request.client.host if request.client else None
    region = state.resolver.resolve(peer, request.headers)
    request_id = request.headers.get("x-request-id") or new_id("req")
    user = body.get("user")
    sticky = user if isinstance(user, str) and user else request_id
    decision = state.planner.plan(body, region, sticky)
    upstream = dict(body)
    upstream["stream"] = True
    if not body["stream"]:
        upstream["stream_options"] = {"include_usage": True}
    headers = {
        "content-type": "application/json",
        "accept": "text/event-stream",
        "x-priority": tenant.priority,
        "x-request-id": request_id,
    }
    req = RouteRequest(body, kind, path, region, sticky, headers, arrived, upstream)
    opened = await state.dispatcher.open(req, decision)
    route_headers = {
        "X-Route-Tier": opened.cand.tier,
        "X-Route-Instance": opened.cand.id,
        "X-Route-Region": opened.cand.region,
        "X-Route-User-Region": region.region,
        "X-Route-Reason": opened.reason,
        "X-Request-Id": request_id,
    }
    stream = StreamState(kind)
    relay = state.dispatcher.relay(req, opened, stream)
    if body["stream"]:
        route_headers["Cache-Control"] = "no-cache"
        return StreamingResponse(relay, media_type="text/event-stream", headers=route_headers)
    try:
        async for _ in relay:
            pass
    finally:
        await relay.aclose()
    if stream.error is not None:
        raise stream.error
    return JSONResponse(assemble(stream), headers=route_headers)


@router.post(
    "/v1/chat/completions",
    openapi_extra=request_body("ChatCompletionRequest"),
    responses={**STREAM_RESPONSES, **ERROR_RESPONSES},
    tags=["openai"],
)
async def chat_completions(request: Request) -> Response:
    """Create a chat completion, routed to the edge or the center."""
    return await _route(request, "chat", "/v1/chat/completions")


@router.post(
    "/v1/completions",
    openapi_extra=request_body("CompletionRequest"),
    responses={**STREAM_RESPONSES, **ERROR_RESPONSES},
    tags=["openai"],
)
async def completions(request: Request) -> Response:
    """Create a text completion, routed to the edge or the center."""
    return await _route(request, "completion", "/v1/completions")


@router.post(
    "/v1/route/explain",
    openapi_extra=request_body("ChatCompletionRequest"),
    responses=ERROR_RESPONSES,
    tags=["router"],
)
async def explain(request: Request) -> Response:
    """The routing decision for a request body, without calling any engine."""
    state = _state(request)
    state.auth.authenticate(request.headers.get("authorization"))
    raw = await _read_body(request, state.settings.max_body_bytes)
    kind: Kind = "completion" if b'"prompt"' in raw and b'"messages"' not in raw else "chat"
    peek = _validated(kind, raw)
    peer = request.client.host if request.client else None
    region = state.resolver.resolve(peer, request.headers)
    user = peek.get("user")
    sticky = user if isinstance(user, str) and user else new_id("req")
    decision = state.planner.plan(peek, region, sticky)
    return JSONResponse(decision.to_dict())


@router.get("/v1/models", responses=ERROR_RESPONSES, tags=["openai"])
async def models(request: Request) -> Response:
    """Models served by healthy instances, plus the routing aliases."""
    state = _state(request)
    state.auth.authenticate(request.headers.get("authorization"))
    now = int(time.time())
    names = [*state.settings.routing.aliases, *state.planner.models()]
    data = [{"id": n, "object": "model", "created": now, "owned_by": "hybrid-llm"} for n in names]
    return JSONResponse({"object": "list", "data": data})


@router.get("/health", tags=["ops"])
async def health() -> dict[str, str]:
    """Alive."""
    return {"status": "ok"}


@router.get("/ready", responses={503: {"description": "No healthy upstream"}}, tags=["ops"])
async def ready(request: Request) -> Response:
    """200 only while at least one healthy, routable instance exists."""
    state = _state(request)
    healthy = [
        s for s in state.planner.healthy() if state.tracker.stats(s.info.id).circuit != Circuit.OPEN
    ]
    if not healthy:
        err = NotReady("no healthy upstream", retry_after=1)
        return JSONResponse(err.body(), status_code=503, headers=err.headers())
    return JSONResponse({"status": "ready", "instances": len(healthy)})


@router.get(
    "/metrics",
    tags=["ops"],
    responses={200: {"description": "Prometheus text", "content": {"text/plain": {}}}},
)
async def metrics(request: Request) -> Response:
    """Prometheus text format."""
    state = _state(request)
    m = state.metrics
    healthy = state.planner.healthy()
    for tier in ("edge", "center"):
        m.candidates.labels(tier).set(sum(1 for s in healthy if s.info.tier == tier))
    m.catalog_stale.set(1 if state.stale() else 0)
    for iid, stats in state.tracker.items():
        m.circuit.labels(iid).set(int(stats.circuit))
    return Response(m.render(), media_type="text/plain; version=0.0.4; charset=utf-8")
