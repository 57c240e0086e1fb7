"""The edge agent: one quantized model served near users.

``create_app(settings)`` builds everything; the lifespan owns the engine,
the admission queue and the metrics registry. Engines come from an
:data:`~edge_agent.engines.EngineFactory` (the real ones by default), so the
HTTP layer can be tested over a scripted engine. The model loads and warms in
the background after the socket is open, so `/ready` can say 503 meanwhile.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any, cast

from fastapi import FastAPI, Request
from prometheus_client import CollectorRegistry

from edge_agent.engines import EngineFactory, engine_collectors, engine_factory
from edge_agent.settings import EdgeSettings
from edge_agent.slot import ModelSlot
from model_sync.agent import Reconciler
from servekit.admission import AdmissionQueue
from servekit.api import ServingCore, build_serving_app
from servekit.engine.protocol import LoadReport
from servekit.errors import NotReady
from servekit.metrics import ServingMetrics
from servekit.registration import Registration, instance_entry
from servekit.registry import InstanceInfo
from servekit.service_auth import TokenGate, warn_if_open
from servekit.tracing import instance_resource, start_tracing

__all__ = ["EdgeAgent", "create_app"]

log = logging.getLogger("edge_agent")


class EdgeAgent:
    """The running parts of one edge agent, as the lifespan assembles them."""

    def __init__(self, settings: EdgeSettings, build: EngineFactory | None = None) -> None:
        self.settings = settings
        self._build = build or engine_factory(settings)
        version = settings.instance.version
        engine = self._build(settings.engine, version)
        self.slot = ModelSlot(engine, version)
        self.admission = AdmissionQueue.from_settings(engine.capacity, settings.admission)
        self.prometheus = CollectorRegistry()
        self.metrics = ServingMetrics(
            self.prometheus,
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
            max_tokens_limit=settings.engine.context_window,
            stream_deadline_s=settings.server.stream_deadline_s,
            tracing=start_tracing(
                settings.tracing,
                "edge-agent",
                instance_resource("edge", settings.instance, settings.engine.model_name),
            ),
        )
        for collector in engine_collectors(
            settings.engine, lambda: self.slot.current().engine, self.metrics.labels
        ):
            self.prometheus.register(collector)
        self.load_error: BaseException | None = None
        self.registration = Registration(settings.registry, self.instance_info, self._load)
        self.reconciler: Reconciler | None = None
        self.reconciling: asyncio.Task[None] | None = None

    def instance_info(self) -> InstanceInfo:
        s = self.settings
        return instance_entry(
            s.instance,
            s.server,
            tier="edge",
            model=s.engine.model_name,
            version=self.slot.version,
            capacity=self.admission.slots,
        )

    async def register(self) -> None:
        """Join the registry (when configured); heartbeats carry the load report."""
        registry = await self.registration.start()
        sync = self.settings.model_sync
        if registry is not None and sync is not None and sync.enabled:
            reconciler = Reconciler.from_settings(
                sync,
                registry,
                self.settings.instance.id,
                self.swap_model,
                model=self.settings.engine.model_name,
                version=self.slot.version,
                stats=self._load,
            )
            self.reconciler = reconciler
            self.reconciling = asyncio.create_task(reconciler.run())

    def reload(self, fresh: EdgeSettings) -> None:
        """What a SIGHUP applies beyond the service tokens: the keys version records
        must be signed with (the reconciler logs what changed; without a running
        reconciler they are read when it starts)."""
        if self.reconciler is not None:
            sync = fresh.model_sync
            self.reconciler.trust(sync.trusted_keys if sync is not None else [])

    def _load(self) -> LoadReport:
        return self.core.load()

    async def start(self) -> None:
        try:
            await self.slot.current().start()
            if self.core.max_tokens_limit is None:
                # A vLLM engine learns its max_model_len from the server it started.
                self.core.max_tokens_limit = self.slot.current().load().max_context_tokens
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
        engine_settings = self.settings.engine.with_model(model_path)
        engine = self._build(engine_settings, version)
        if engine_settings.fits_beside(model_path):
            await self.slot.swap(engine, version)
        else:
            log.warning("not enough memory to load %s beside the current model: draining", version)
            self.core.draining = True
            old_settings, old_version = self.settings.engine, self.slot.version
            try:
                await self.slot.replace_when_idle(
                    engine, version, rebuild_old=lambda: self._build(old_settings, old_version)
                )
            finally:
                self.core.draining = False
        self.settings = self.settings.model_copy(update={"engine": engine_settings})
        self.core.version = version
        self.metrics.set_version(version)
        self.registration.update_info()

    def engine_status(self) -> dict[str, Any]:
        current = self.slot.current()
        # A process engine (vLLM) describes its process; in-process engines have none.
        process: dict[str, Any] = getattr(current.engine, "status", dict)()
        return {
            "kind": self.settings.engine.kind,
            "model": current.model_name,
            "version": current.version,
            "in_flight": current.active,
            **process,
        }

    def drain(self) -> None:
        """Stop taking new work and tell the fleet, before connections close."""
        self.core.draining = True
        self.registration.mark_draining()

    async def aclose(self) -> None:
        self.drain()
        if self.reconciling is not None:
            self.reconciling.cancel()
            await asyncio.gather(self.reconciling, return_exceptions=True)
        await self.slot.aclose(self.settings.server.graceful_shutdown_s)
        await self.registration.aclose()
        self.core.tracing.shutdown()


def create_app(settings: EdgeSettings, *, engine_factory: EngineFactory | None = None) -> FastAPI:
    """The edge agent's app; ``engine_factory`` builds each engine it serves
    (default: the real one the settings name).

    ``app.state.token_gate`` holds the accepted service tokens; a SIGHUP reload
    applies the file's tokens and its ``model_sync.trusted_keys``.
    """
    gate = TokenGate(settings.server.auth)

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        agent = EdgeAgent(settings, engine_factory)
        app.state.agent = agent
        app.state.core = agent.core
        warn_if_open(gate, "edge agent", settings.server.host, settings.server.port)
        loading = asyncio.create_task(agent.start())
        await agent.register()
        try:
            yield
        finally:
            agent.drain()
            if not loading.done():
                loading.cancel()
            await asyncio.gather(loading, return_exceptions=True)
            await agent.aclose()

    def drain() -> None:
        running = getattr(app.state, "agent", None)
        if running is not None:
            running.drain()

    def reload(fresh: EdgeSettings) -> None:
        running = getattr(app.state, "agent", None)
        if running is not None:
            running.reload(fresh)

    app = build_serving_app(
        title="edge-agent",
        version="0.1.0",
        lifespan=lifespan,
        max_body_bytes=settings.server.max_body_bytes,
        example_model=settings.engine.model_name,
        max_tokens_limit=settings.engine.context_window,
        auth=gate,
        drain=drain,
        reload=reload,
    )

    @app.get("/engine", summary="The serving engine: kind, version and, for a process engine, "
             "its process (pid, address, command, log, restarts)")  # fmt: skip
    async def engine_status(request: Request) -> dict[str, Any]:
        agent = getattr(request.app.state, "agent", None)
        if agent is None:
            raise NotReady("service is starting", retry_after=1)
        return cast(EdgeAgent, agent).engine_status()

    return app
