"""The OpenAI-compatible routes and the operational endpoints of a serving instance."""

from __future__ import annotations

from collections.abc import Callable
from typing import Annotated, Any, cast

from fastapi import APIRouter, Depends, FastAPI, Request
from fastapi.responses import JSONResponse, PlainTextResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from servekit.api.core import ServingCore, core_of
from servekit.api.endpoints import CompletionEndpoints
from servekit.api.errors import error_response, install_error_handlers
from servekit.api.openapi import document_completions, error_doc
from servekit.errors import NotReady
from servekit.serve_cli import ServiceHooks
from servekit.service_auth import ServiceAuth, TokenGate
from servekit.wire import ModelCard, ModelList

__all__ = ["build_serving_app", "get_core"]


def get_core(request: Request) -> ServingCore:
    return core_of(request.app)


CoreDep = Annotated[ServingCore, Depends(get_core)]


def openai_router() -> APIRouter:
    """``/v1/models``; the completion endpoints are plain ASGI (:mod:`servekit.api.endpoints`)."""
    router = APIRouter()

    @router.get("/v1/models", response_model=ModelList, summary="List served models")
    async def models(core: CoreDep) -> ModelList:
        return ModelList(data=[ModelCard(id=name) for name in core.model_names()])

    return router


def ops_router() -> APIRouter:
    router = APIRouter()

    @router.get("/health", summary="Liveness")
    async def health() -> dict[str, str]:
        return {"status": "ok"}

    @router.get(
        "/ready",
        summary="Readiness: 503 while loading, warming or draining",
        responses={503: error_doc("Not ready.")},
    )
    async def ready(request: Request) -> Response:
        core = getattr(request.app.state, "core", None)
        if core is not None and await cast(ServingCore, core).ready():
            return JSONResponse({"status": "ready"})
        state = "draining" if core is not None and core.draining else "loading"
        return error_response(NotReady(f"not ready: {state}", retry_after=1))

    @router.get("/load", summary="Load report carried by registry heartbeats")
    async def load(core: CoreDep) -> dict[str, Any]:
        return core.load().to_dict()

    @router.get("/metrics", summary="Prometheus metrics", response_class=PlainTextResponse)
    async def metrics(core: CoreDep) -> Response:
        return Response(generate_latest(core.metrics.registry), media_type=CONTENT_TYPE_LATEST)

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
) -> FastAPI:
    """A FastAPI app with the OpenAI and ops routes; ``lifespan`` sets ``app.state.core``.

    ``auth`` (kept on ``app.state.token_gate``) guards every route but
    ``/health``, ``/ready`` and, unless protected, ``/metrics``. The app's
    :class:`~servekit.serve_cli.ServiceHooks` call ``drain`` on SIGTERM and,
    on SIGHUP, accept the service tokens of the reloaded settings.
    """
    app = FastAPI(title=title, version=version, lifespan=lifespan)
    install_error_handlers(app)
    app.include_router(openai_router())
    app.include_router(ops_router())
    app.add_middleware(CompletionEndpoints, max_body_bytes=max_body_bytes)
    gate = auth or TokenGate()
    app.state.token_gate = gate
    app.add_middleware(ServiceAuth, gate=gate)  # outermost: before any body is read
    document_completions(app, example_model, max_tokens_limit)

    def reload(fresh: Any) -> None:
        gate.update(fresh.server.auth)

    app.state.hooks = ServiceHooks(drain=drain, reload=reload)
    return app
