"""The routes every service answers the same way: ``/v1/models``, ``/health``, ``/ready``,
``/metrics``.

What each one *says* comes from the running service's :class:`ServiceOps`
(``app.state.ops``): a serving instance reports its engine's names and
readiness (:class:`CoreOps`), the router its aliases and healthy instances
(``geo_router.ops.RouterOps``). Before the lifespan has built the service
they answer 503. ``/metrics`` adds what the connection guards closed
(``app.state.connection_guard``), which every service counts the same way.
"""

from __future__ import annotations

from typing import Any, Protocol, cast

from fastapi import APIRouter, FastAPI, Request
from fastapi.responses import JSONResponse, PlainTextResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from servekit.api.core import core_of
from servekit.api.errors import error_response
from servekit.api.openapi import error_doc
from servekit.errors import NotReady, ServeError
from servekit.metrics import GuardMetrics
from servekit.wire import ModelCard, ModelList

__all__ = ["CoreOps", "ServiceOps", "ops_router"]


class ServiceOps(Protocol):
    """What the shared routes ask of a running service."""

    def model_names(self, request: Request) -> list[str]:
        """Names ``/v1/models`` lists (may refuse the caller: 401)."""
        ...

    async def readiness(self) -> dict[str, Any]:
        """The ``/ready`` body; raises :class:`NotReady` while loading, draining or cut off."""
        ...

    def metrics(self) -> tuple[bytes, str]:
        """Prometheus text and its content type."""
        ...


class CoreOps:
    """A serving instance's answers, from the core its lifespan stored (``app.state.core``)."""

    def __init__(self, app: FastAPI) -> None:
        self._app = app

    def model_names(self, request: Request) -> list[str]:
        return core_of(self._app).model_names()

    async def readiness(self) -> dict[str, Any]:
        core = getattr(self._app.state, "core", None)
        if core is not None and await core.ready():
            return {"status": "ready"}
        state = "draining" if core is not None and core.draining else "loading"
        raise NotReady(f"not ready: {state}", retry_after=1)

    def metrics(self) -> tuple[bytes, str]:
        return generate_latest(core_of(self._app).metrics.registry), CONTENT_TYPE_LATEST


def _ops(request: Request) -> ServiceOps:
    ops = getattr(request.app.state, "ops", None)
    if ops is None:
        raise NotReady("service is starting", retry_after=1)
    return cast(ServiceOps, ops)


def ops_router(responses: dict[int | str, dict[str, Any]] | None = None) -> APIRouter:
    """The shared routes; ``responses`` documents the errors ``/v1/models`` may answer."""
    router = APIRouter()

    @router.get(
        "/v1/models",
        response_model=ModelList,
        summary="List served models",
        responses=responses,
        tags=["openai"],
    )
    async def models(request: Request) -> ModelList:
        names = _ops(request).model_names(request)
        return ModelList(data=[ModelCard(id=name) for name in names])

    @router.get("/health", summary="Liveness", tags=["ops"])
    async def health() -> dict[str, str]:
        return {"status": "ok"}

    @router.get(
        "/ready",
        summary="Readiness: 503 while loading, warming, draining or without a healthy upstream",
        responses={503: error_doc("Not ready.")},
        tags=["ops"],
    )
    async def ready(request: Request) -> Response:
        try:
            return JSONResponse(await _ops(request).readiness())
        except ServeError as exc:
            return error_response(exc)

    @router.get(
        "/metrics", summary="Prometheus metrics", response_class=PlainTextResponse, tags=["ops"]
    )
    async def metrics(request: Request) -> Response:
        body, content_type = _ops(request).metrics()
        guard: GuardMetrics | None = getattr(request.app.state, "connection_guard", None)
        if guard is not None:
            body += generate_latest(guard.registry)
        return Response(body, media_type=content_type)

    return router
