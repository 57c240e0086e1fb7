"""A serving instance's app: the service kit over an engine's :class:`ServingCore`."""

from __future__ import annotations

from collections.abc import Callable
from typing import Annotated, Any

from fastapi import APIRouter, Depends, FastAPI, Request

from servekit.api.core import ServingCore, core_of
from servekit.api.openapi import document_completions
from servekit.api.ops import CoreOps
from servekit.api.service import create_service_app
from servekit.serve_cli import ServiceHooks
from servekit.service_auth import TokenGate

__all__ = ["build_serving_app", "get_core"]


def get_core(request: Request) -> ServingCore:
    return core_of(request.app)


CoreDep = Annotated[ServingCore, Depends(get_core)]


def load_router() -> APIRouter:
    """``/load``: what a serving instance reports to the fleet."""
    router = APIRouter()

    @router.get("/load", summary="Load report carried by registry heartbeats", tags=["ops"])
    async def load(core: CoreDep) -> dict[str, Any]:
        return core.load().to_dict()

    return router


def build_serving_app(
    *,
    title: str,
    version: str,
    lifespan: Any,
    max_body_bytes: int = 1 << 20,
    example_model: str | None = None,
    max_tokens_limit: int | None = None,
    auth: TokenGate | None = None,
    drain: Callable[[], None] = lambda: None,
    reload: Callable[[Any], None] = lambda fresh: None,
) -> FastAPI:
    """An engine-serving app (edge agent, central gateway, doubles); ``lifespan`` sets
    ``app.state.core``. SIGHUP accepts the service tokens of the reloaded settings,
    then hands them to the service's own ``reload``."""
    gate = auth or TokenGate()

    def reloaded(fresh: Any) -> None:
        gate.update(fresh.server.auth)
        reload(fresh)

    return create_service_app(
        title=title,
        version=version,
        lifespan=lifespan,
        ops=CoreOps,
        hooks=ServiceHooks(drain=drain, reload=reloaded),
        document=lambda app: document_completions(app, example_model, max_tokens_limit),
        max_body_bytes=max_body_bytes,
        auth=gate,
        routers=[load_router()],
    )
