"""The router's FastAPI endpoints: models, explain, health, readiness, metrics.

The completion endpoints themselves are plain ASGI (``geo_router.completions``).
"""

from __future__ import annotations

import json
import time
from collections.abc import Awaitable, Callable

from fastapi import APIRouter
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from geo_router.continuation import Kind
from geo_router.feedback import RATING_SCHEMA, parse_rating
from geo_router.openapi import ERROR_RESPONSES, request_body
from geo_router.state import RouterState, intake
from geo_router.tracker import Circuit
from servekit.errors import InvalidRequest, NotReady

__all__ = ["router"]

router = APIRouter()


def _state(request: Request) -> RouterState:
    state: RouterState = request.app.state.router
    return state


def _explainer(kind: Kind, path: str) -> Callable[[Request], Awaitable[Response]]:
    async def explain(request: Request) -> Response:
        """The routing decision for a body sent to ``path``: the completion path's own
        intake (no rate limit counted), no engine called."""
        state = _state(request)
        raw = await request.body()  # bounded by the front door (413)
        peer = request.client.host if request.client else None
        taken = intake(state, kind, path, raw, request.headers, peer, limit=False)
        return JSONResponse(taken.decision.to_dict())

    return explain


# (explain path, kind, the completion path it explains, its body's schema)
_EXPLAINED: tuple[tuple[str, Kind, str, str], ...] = (
    ("/v1/route/explain", "chat", "/v1/chat/completions", "ChatCompletionRequest"),
    ("/v1/route/explain/completions", "completion", "/v1/completions", "CompletionRequest"),
)
for _at, _kind, _path, _schema in _EXPLAINED:
    router.add_api_route(
        _at,
        _explainer(_kind, _path),
        methods=["POST"],
        name=f"explain_{_kind}",
        summary=f"The routing decision for a {_path} body, without calling any engine",
        openapi_extra=request_body(_schema),
        responses=ERROR_RESPONSES,
        tags=["router"],
    )


@router.get("/v1/models", responses=ERROR_RESPONSES, tags=["openai"])
async def models(request: Request) -> Response:
    """Models served by healthy instances, plus the routing aliases."""
    state = _state(request)
    state.auth.authenticate(request.headers.get("authorization"))
    now = int(time.time())
    names = [*state.settings.routing.aliases, *state.planner.models()]
    data = [{"id": n, "object": "model", "created": now, "owned_by": "hybrid-llm"} for n in names]
    return JSONResponse({"object": "list", "data": data})


@router.post(
    "/v1/feedback",
    responses=ERROR_RESPONSES,
    tags=["router"],
    openapi_extra={
        "requestBody": {
            "required": True,
            "content": {"application/json": {"schema": RATING_SCHEMA}},
        }
    },
)
async def feedback(request: Request) -> Response:
    """Rate an answer this key was served: ``{"response_id", "score" | "thumbs", "comment"?}``."""
    state = _state(request)
    tenant = state.auth.authenticate(request.headers.get("authorization"))
    raw = await request.body()
    try:
        body = json.loads(raw)
    except (ValueError, UnicodeDecodeError):
        raise InvalidRequest("the body is not valid JSON") from None
    rating = parse_rating(body)
    served = await state.feedback.rate(tenant.name, rating)
    return JSONResponse(
        {
            "response_id": rating.response_id,
            "score": rating.score,
            "tier": served.tier,
            "version": served.version,
            "task": served.task,
        }
    )


@router.get("/health", tags=["ops"])
async def health() -> dict[str, str]:
    """Alive."""
    return {"status": "ok"}


@router.get("/ready", responses={503: {"description": "No healthy upstream"}}, tags=["ops"])
async def ready(request: Request) -> Response:
    """200 only while at least one healthy, routable instance exists."""
    state = _state(request)
    if getattr(request.app.state, "draining", False):
        err = NotReady("draining", retry_after=1)
        return JSONResponse(err.body(), status_code=503, headers=err.headers())
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
