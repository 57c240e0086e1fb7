"""What the router answers on the shared ops routes (:mod:`servekit.api.ops`).

``/v1/models``: the routing aliases and the models healthy instances serve
(the caller's API key is checked); ``/ready``: 503 while draining or while no
healthy, routable instance exists; ``/metrics``: the router's registry, with
the catalog gauges brought up to date first.
"""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI, Request

from geo_router.state import RouterState
from geo_router.tracker import Circuit
from servekit.errors import NotReady

__all__ = ["RouterOps", "router_state"]

_PROMETHEUS_TEXT = "text/plain; version=0.0.4; charset=utf-8"


def router_state(app: Any) -> RouterState:
    """The state the router's lifespan built, or 503 while it is starting."""
    found = getattr(app.state, "router", None)
    if not isinstance(found, RouterState):
        raise NotReady("router is starting", retry_after=1)
    return found


class RouterOps:
    """The router as :class:`servekit.api.ops.ServiceOps` sees it."""

    def __init__(self, app: FastAPI) -> None:
        self._app = app
        self.draining = False

    def model_names(self, request: Request) -> list[str]:
        state = router_state(self._app)
        state.auth.authenticate(request.headers.get("authorization"))
        return [*state.settings.routing.aliases, *state.planner.models()]

    async def readiness(self) -> dict[str, Any]:
        if self.draining:
            raise NotReady("draining", retry_after=1)
        state = router_state(self._app)
        healthy = [
            s
            for s in state.planner.healthy()
            if state.tracker.stats(s.info.id).circuit != Circuit.OPEN
        ]
        if not healthy:
            raise NotReady("no healthy upstream", retry_after=1)
        return {"status": "ready", "instances": len(healthy)}

    def metrics(self) -> tuple[bytes, str]:
        state = router_state(self._app)
        m = state.metrics
        healthy = state.planner.healthy()
        for tier in ("edge", "center"):
            m.candidates.labels(tier).set(sum(1 for s in healthy if s.info.tier == tier))
        m.catalog_stale.set(1 if state.stale() else 0)
        for iid, stats in state.tracker.items():
            m.circuit.labels(iid).set(int(stats.circuit))
        return m.render(), _PROMETHEUS_TEXT
