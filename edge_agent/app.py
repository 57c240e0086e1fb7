"""The edge agent: one quantized model served near users.

``create_app(settings)`` builds everything; the lifespan owns the engine,
the admission queue and the metrics registry. The model loads and warms in
the background after the socket is open, so `/ready` can say 503 meanwhile.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

from fastapi import FastAPI
from prometheus_client import CollectorRegistry

from edge_agent.engines import build_engine
from edge_agent.settings import EdgeSettings
from edge_agent.slot import ModelSlot
from servekit.admission import AdmissionQueue
from servekit.api import ServingCore, build_serving_app
from servekit.engine.protocol import LoadReport
from servekit.metrics import ServingMetrics
from servekit.sysinfo import fits_beside

__all__ = ["EdgeAgent", "create_app"]

log = logging.getLogger("edge_agent")


class EdgeAgent:
    """The running parts of one edge agent, as the lifespan assembles them."""

    def __init__(self, settings: EdgeSettings) -> None:
        self.settings = settings
        version = settings.instance.version
        engine = build_engine(settings.engine, version)
        self.slot = ModelSlot(engine, version)
        self.admission = AdmissionQueue(
            engine.capacity,
            settings.admission.max_waiting,
            batch_every=settings.admission.batch_every,
        )
        self.registry = CollectorRegistry()
        self.metrics = ServingMetrics(
            self.registry,
            model=engine.model_name,
            version=version,
            region=settings.instance.region,
            tier="edge",
            load=self._load,
        )
        self.core = ServingCore(
            self.slot,
            self.admission,
            self.metrics,
            aliases=frozenset(settings.aliases),
            version=version,
        )
        self.load_error: BaseException | None = None

    def _load(self) -> LoadReport:
        return self.core.load()

    async def start(self) -> None:
        try:
            await self.slot.current().start()
            log.info("model %s ready", self.settings.engine.model_name)
        except Exception as exc:
            self.load_error = exc
            log.error("model failed to load: %s", exc)

    async def swap_model(self, model_path: Path, version: str) -> None:
        """Load ``model_path`` as ``version`` beside the current model, warm it, swap.

        When memory is too tight to hold both, drain first: new requests get
        503 (the router sends them elsewhere) while in-flight ones finish.
        Raises if the new model fails to load; the old one keeps serving.
        """
        engine_settings = self.settings.engine.model_copy(update={"model_path": model_path})
        engine = build_engine(engine_settings, version)
        if fits_beside(model_path):
            await self.slot.swap(engine, version)
        else:
            log.warning("not enough memory to load %s beside the current model: draining", version)
            self.core.draining = True
            old_settings, old_version = self.settings.engine, self.slot.version
            try:
                await self.slot.replace_when_idle(
                    engine, version, rebuild_old=lambda: build_engine(old_settings, old_version)
                )
            finally:
                self.core.draining = False
        self.settings = self.settings.model_copy(update={"engine": engine_settings})
        self.core.version = version
        self.metrics.set_version(version)

    def drain(self) -> None:
        self.core.draining = True

    async def aclose(self) -> None:
        self.drain()
        await self.slot.aclose(self.settings.server.graceful_shutdown_s)


def create_app(settings: EdgeSettings) -> FastAPI:
    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        agent = EdgeAgent(settings)
        app.state.agent = agent
        app.state.core = agent.core
        loading = asyncio.create_task(agent.start())
        try:
            yield
        finally:
            agent.drain()
            if not loading.done():
                loading.cancel()
            await asyncio.gather(loading, return_exceptions=True)
            await agent.aclose()

    return build_serving_app(
        title="edge-agent",
        version="0.1.0",
        lifespan=lifespan,
        max_body_bytes=settings.server.max_body_bytes,
    )
