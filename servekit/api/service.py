"""``create_service_app``: the one way every service (router, edge, central) is composed.

Each gets the same FastAPI app around its own parts: the OpenAI error
handlers, the shared ops routes (:mod:`servekit.api.ops`), the completion
endpoints as plain ASGI in front (:class:`~servekit.api.endpoints.CompletionEndpoints`,
with the service's ``complete``: generate on an engine, or route), optional
service-token auth outermost, its OpenAPI document, and the
:class:`~servekit.serve_cli.ServiceHooks` ``serve`` calls on SIGTERM (drain)
and SIGHUP (reload). Only the lifespan (which builds and closes the
service's clients) and a few extra routes differ per service.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from fastapi import APIRouter, FastAPI

from servekit.api.endpoints import CompletionEndpoints, CompletionHandler, serve_completion
from servekit.api.errors import install_error_handlers
from servekit.api.ops import ServiceOps, ops_router
from servekit.errors import ServeError
from servekit.serve_cli import ServiceHooks
from servekit.service_auth import ServiceAuth, TokenGate

__all__ = ["create_service_app"]


def create_service_app(
    *,
    title: str,
    version: str,
    lifespan: Any,
    ops: Callable[[FastAPI], ServiceOps],
    hooks: ServiceHooks,
    document: Callable[[FastAPI], None],
    max_body_bytes: int = 1 << 20,
    complete: CompletionHandler = serve_completion,
    on_error: Callable[[ServeError], None] | None = None,
    auth: TokenGate | None = None,
    routers: Sequence[APIRouter] = (),
    models_responses: dict[int | str, dict[str, Any]] | None = None,
) -> FastAPI:
    """A service's app. ``ops`` answers the shared routes, ``document`` installs its
    OpenAPI document; ``auth`` (on ``app.state.token_gate``) guards every route but
    ``/health``, ``/ready`` and, unless protected, ``/metrics``."""
    app = FastAPI(title=title, version=version, lifespan=lifespan)
    install_error_handlers(app, on_error=on_error)
    for router in routers:
        app.include_router(router)
    app.include_router(ops_router(models_responses))
    app.add_middleware(
        CompletionEndpoints, max_body_bytes=max_body_bytes, complete=complete, on_error=on_error
    )
    if auth is not None:
        app.state.token_gate = auth
        app.add_middleware(ServiceAuth, gate=auth)  # outermost: before any body is read
    app.state.ops = ops(app)
    app.state.hooks = hooks
    document(app)
    return app
