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
from servekit.asgi import ASGIApp, Receive, Scope, Send
from servekit.errors import ServeError
from servekit.metrics import GuardMetrics
from servekit.serve_cli import ServiceHooks
from servekit.service_auth import ServiceAuth, TokenGate

__all__ = ["create_service_app", "wrap_front"]


class _ServiceApp(FastAPI):
    """FastAPI with the service's front doors *outside* its middleware stack.

    Every streamed chunk passes through each layer between the server and the
    completion handler; Starlette's error middleware (outermost in its own
    stack) would wrap every send. The completion endpoints render their own
    errors, so they sit in front of it, behind only the service-token check.
    """

    front: Callable[[ASGIApp], ASGIApp] = staticmethod(lambda app: app)

    def build_middleware_stack(self) -> ASGIApp:
        return self.front(super().build_middleware_stack())

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        """HTTP goes straight to the doors, as ``Starlette.__call__`` sends it:
        FastAPI's own entry (0.165+) asks the global OpenTelemetry providers
        whether to instrument on every request, which the services never want
        (their spans are their own, ``servekit.tracing``) and which cost every
        completion a share of its time to first token."""
        if scope["type"] != "http":
            await super().__call__(scope, receive, send)
            return
        if self.root_path:
            scope["root_path"] = self.root_path
        scope["app"] = self
        if self.middleware_stack is None:
            self.middleware_stack = self.build_middleware_stack()
        await self.middleware_stack(scope, receive, send)


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
    ``/health``, ``/ready`` and, unless protected, ``/metrics``; ``app.state.connection_guard``
    counts what the connection guards close (``/metrics`` serves it too)."""
    app = _ServiceApp(title=title, version=version, lifespan=lifespan)
    install_error_handlers(app, on_error=on_error)
    for router in routers:
        app.include_router(router)
    app.include_router(ops_router(models_responses))

    def front(inner: ASGIApp) -> ASGIApp:
        door: ASGIApp = CompletionEndpoints(inner, max_body_bytes, complete, on_error)
        if auth is not None:
            door = ServiceAuth(door, gate=auth)  # outermost: before any body is read
        return door

    app.front = front
    app.state.connection_guard = GuardMetrics()  # `serve` hands it to the HTTP protocol
    if auth is not None:
        app.state.token_gate = auth
    app.state.ops = ops(app)
    app.state.hooks = hooks
    document(app)
    return app


def wrap_front(app: FastAPI, outer: Callable[[ASGIApp], ASGIApp]) -> None:
    """Put ``outer`` in front of a service app's doors, the completion endpoints
    included (middleware added with ``add_middleware`` sits behind them and never
    sees a completion). For a test double that records what arrives on the wire."""
    if not isinstance(app, _ServiceApp):
        raise TypeError("not an app built by create_service_app")
    doors = app.front
    app.front = lambda inner: outer(doors(inner))
