"""A real HTTP double of an engine replica (think: a vLLM server we can script).

It is an OpenAI-compatible server on a real socket, built with the shared
serving layer over the scripted engine of :mod:`tests.support.engines`, so
its ``/health``, ``/metrics`` (``vllm:num_requests_running`` / ``_waiting``
gauges) and SSE are what a replica looks like on the wire. Prompts starting
with ``HOLD`` block until ``POST /release``; ``POST /fail?n=N`` makes the
next N generations fail before their first token; prompts starting with
``BREAK`` fail after two tokens.
Every prompt is recorded, in arrival order, at ``/arrivals``,
and the body's ``priority`` field (vLLM's) at ``/priorities``.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from fastapi import FastAPI
from prometheus_client import CollectorRegistry

from servekit.admission import AdmissionQueue
from servekit.api import FixedEngine, ServingCore, build_serving_app
from servekit.engine.protocol import LoadReport
from servekit.metrics import ServingMetrics
from servekit.service_auth import ServiceAuthSettings, TokenGate
from tests.support.engines import ScriptedEngine


def create_double(model: str, tokens: list[str] | None = None) -> FastAPI:
    """The double; with ``tokens`` it accepts only callers sending one of them."""
    engine = ScriptedEngine(model)

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        registry = CollectorRegistry()
        admission = AdmissionQueue(engine.capacity, 64)
        core: ServingCore | None = None

        def load() -> LoadReport:
            assert core is not None
            return core.load()

        metrics = ServingMetrics(
            registry, model=model, version="", region="r", tier="center", load=load
        )
        core = ServingCore(FixedEngine(engine), admission, metrics)
        await engine.start()
        app.state.core = core
        yield

    gate = TokenGate(ServiceAuthSettings.model_validate({"tokens": tokens or []}))
    app = build_serving_app(title="engine-double", version="0", lifespan=lifespan, auth=gate)
    app.state.engine = engine

    @app.post("/release")
    async def release() -> dict[str, Any]:
        engine.release.set()
        return {"released": True}

    @app.post("/fail")
    async def fail(n: int = 1) -> dict[str, Any]:
        engine.fail_next = n
        return {"fail_next": n}

    @app.get("/arrivals")
    async def arrivals() -> list[str]:
        return engine.arrivals

    @app.get("/requests")
    async def requests() -> list[dict[str, Any]]:
        return [
            {
                "messages": [[m.role, m.content] for m in r.messages or ()],
                "prompt": r.prompt,
                "continue_final_message": r.continue_final_message,
                "max_tokens": r.sampling.max_tokens,
            }
            for r in engine.requests
        ]

    @app.get("/priorities")
    async def priorities() -> list[Any]:
        return engine.priorities

    return app
