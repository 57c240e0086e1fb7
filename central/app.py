"""The central gateway: the shared OpenAI serving layer over a replica pool.

``create_app(settings)`` builds everything in the lifespan: the pool (which
launches and supervises the replicas), the two-priority admission queue in
front of it (interactive first, batch never starved; its width follows the
capacity of the healthy replicas), the metrics registry with ``tier=center``
labels, and the registry heartbeat. Besides the shared routes it serves
``GET /replicas``, the operator's view of every replica.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any, cast

from fastapi import FastAPI, Request
from prometheus_client import CollectorRegistry

from central.engines import http_engine_factory
from central.pool import ReplicaPool
from central.registration import center_instance
from central.replica import EngineFactory
from central.settings import CentralSettings
from central.telemetry import ReplicaCollector
from servekit.admission import AdmissionQueue
from servekit.api import FixedEngine, ServingCore, build_serving_app
from servekit.engine.protocol import LoadReport
from servekit.errors import NotReady
from servekit.metrics import ServingMetrics
from servekit.registration import Registration
from servekit.service_auth import TokenGate, warn_if_open
from servekit.tracing import instance_resource, start_tracing

__all__ = ["CentralGateway", "create_app"]

log = logging.getLogger("central")


class CentralGateway:
    """The running parts of one central gateway, as the lifespan assembles them."""

    def __init__(self, settings: CentralSettings, engine_factory: EngineFactory) -> None:
        self.settings = settings
        self.pool = ReplicaPool(settings, engine_factory, on_capacity=self._resize)
        # Until replicas report in, admit as if all were up; health narrows it.
        self.admission = AdmissionQueue.from_settings(self.pool.capacity, settings.admission)
        self.registry = CollectorRegistry()
        self.metrics = ServingMetrics(
            self.registry,
            model=settings.model,
            version=settings.version,
            region=settings.instance.region,
            tier="center",
            load=self._load,
        )
        self.registry.register(ReplicaCollector(self.pool, self.metrics.labels))
        resource = instance_resource("center", settings.instance, settings.model)
        self.core = ServingCore(
            FixedEngine(self.pool),
            self.admission,
            self.metrics,
            version=settings.version,
            stream_deadline_s=settings.server.stream_deadline_s,
            tracing=start_tracing(settings.tracing, "central", resource),
        )
        capacity = self.pool.capacity
        self.registration = Registration(
            settings.registry, lambda: center_instance(settings, capacity), self._load
        )

    def _load(self) -> LoadReport:
        return self.core.load()

    def _resize(self, slots: int) -> None:
        # The gateway queue holds what the healthy replicas cannot run, so
        # priorities still apply while a replica is down.
        self.admission.resize(slots)

    async def start(self) -> None:
        await self.pool.start()
        await self.registration.start()

    def drain(self) -> None:
        """Stop taking new work and tell the fleet, before connections close."""
        self.core.draining = True
        self.registration.mark_draining()

    async def aclose(self) -> None:
        self.drain()
        await self.registration.aclose()
        await self.pool.aclose()
        self.core.tracing.shutdown()


def create_app(
    settings: CentralSettings, *, engine_factory: EngineFactory | None = None
) -> FastAPI:
    """The central gateway app; ``engine_factory`` builds each replica's HTTP engine."""
    factory = engine_factory or http_engine_factory(settings)
    gate = TokenGate(settings.server.auth)

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        warn_if_open(gate, "central gateway", settings.server.host, settings.server.port)
        gateway = CentralGateway(settings, factory)
        app.state.gateway = gateway
        app.state.core = gateway.core
        await gateway.start()
        try:
            yield
        finally:
            await gateway.aclose()

    def drain() -> None:
        running = getattr(app.state, "gateway", None)
        if running is not None:
            running.drain()

    app = build_serving_app(
        title="central", version="0.1.0", lifespan=lifespan, auth=gate, drain=drain
    )

    @app.get("/replicas", summary="Every replica's state, load and process (secret values as ***)")
    async def replicas(request: Request) -> dict[str, Any]:
        gateway = getattr(request.app.state, "gateway", None)
        if gateway is None:
            raise NotReady("service is starting", retry_after=1)
        pool = cast(CentralGateway, gateway).pool
        return {"model": settings.model, "replicas": pool.status()}

    return app
