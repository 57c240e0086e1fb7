"""The router's own FastAPI endpoints: ``/v1/route/explain`` for each completion
path and ``/v1/feedback`` (users' ratings of answers they were served).

The completion endpoints themselves are plain ASGI (``geo_router.completions``);
models, health, readiness and metrics are the shared ops routes
(``geo_router.ops``).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from fastapi import APIRouter
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from geo_router.continuation import Kind
from geo_router.feedback import RATING_SCHEMA, parse_rating
from geo_router.openapi import ERROR_RESPONSES, request_body
from geo_router.ops import router_state
from geo_router.state import RouterState, intake
from servekit import jsonlimits
from servekit.errors import PermissionDenied

__all__ = ["explain_router"]


def _explainer(kind: Kind, path: str) -> Callable[[Request], Awaitable[Response]]:
    async def explain(request: Request) -> Response:
        """The routing decision for a body sent to ``path``: the completion path's own
        intake (no rate limit counted), no engine called. Operator keys only: it shows
        what each instance holds cached, its URL and its load."""
        state: RouterState = router_state(request.app)
        if not state.auth.authenticate(request.headers.get("authorization")).operator:
            raise PermissionDenied("route explain needs an operator key (auth.keys[].operator)")
        raw = await request.body()  # bounded by the front door (413)
        peer = request.client.host if request.client else None
        taken = await intake(state, kind, path, raw, request.headers, peer, limit=False)
        return JSONResponse(taken.decision.to_dict())

    return explain


async def _feedback(request: Request) -> Response:
    """Rate an answer this key was served: ``{"response_id", "score" | "thumbs", "comment"?}``."""
    state: RouterState = router_state(request.app)
    tenant = state.auth.authenticate(request.headers.get("authorization"))
    raw = await request.body()  # bounded by the front door (413)
    rating = parse_rating(jsonlimits.loads(raw))  # hostile JSON is a 400 here too
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


# (explain path, kind, the completion path it explains, its body's schema)
_EXPLAINED: tuple[tuple[str, Kind, str, str], ...] = (
    ("/v1/route/explain", "chat", "/v1/chat/completions", "ChatCompletionRequest"),
    ("/v1/route/explain/completions", "completion", "/v1/completions", "CompletionRequest"),
)


def explain_router() -> APIRouter:
    """``/v1/route/explain``, ``/v1/route/explain/completions`` and ``/v1/feedback``."""
    router = APIRouter()
    for at, kind, path, schema in _EXPLAINED:
        router.add_api_route(
            at,
            _explainer(kind, path),
            methods=["POST"],
            name=f"explain_{kind}",
            summary=f"The routing decision for a {path} body, without calling any engine",
            openapi_extra=request_body(schema),
            responses=ERROR_RESPONSES,
            tags=["router"],
        )
    router.add_api_route(
        "/v1/feedback",
        _feedback,
        methods=["POST"],
        name="feedback",
        summary="Rate an answer this key was served",
        openapi_extra={
            "requestBody": {
                "required": True,
                "content": {"application/json": {"schema": RATING_SCHEMA}},
            }
        },
        responses=ERROR_RESPONSES,
        tags=["router"],
    )
    return router
