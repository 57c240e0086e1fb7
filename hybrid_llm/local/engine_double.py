"""A real HTTP double of an engine replica (think: a vLLM server we can script).

Tests of the central gateway and ``studies/central_overhead.py`` stand
replicas up with it where a real engine would only add noise.

It is an OpenAI-compatible server on a real socket, built with the shared
serving layer over the scripted engine of :mod:`hybrid_llm.local.scripted_engine`, so
its ``/health``, ``/metrics`` (``vllm:num_requests_running`` / ``_waiting``
gauges) and SSE are what a replica looks like on the wire. Prompts starting
with ``HOLD`` block until ``POST /release``; ``POST /fail?n=N`` makes the
next N generations fail before their first token; prompts starting with
``BREAK`` fail after two tokens; ``POST /refuse?n=N&retry_after=S`` answers
the next N with 429 and ``Retry-After: S``.
Every prompt is recorded, in arrival order, at ``/arrivals``,
and the body's ``priority`` field (vLLM's) at ``/priorities``: read off the
raw body, since the serving layer drops fields the OpenAI surface lacks.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from fastapi import FastAPI
from prometheus_client import CollectorRegistry

from hybrid_llm.local.scripted_engine import ScriptedEngine
from servekit.admission import AdmissionQueue
from servekit.api import FixedEngine, ServingCore, build_serving_app
from servekit.api.endpoints import PATHS
from servekit.api.service import wrap_front
from servekit.asgi import ASGIApp, Receive, Scope, Send, header, read_body, replaying
from servekit.engine.protocol import LoadReport
from servekit.metrics import ServingMetrics
from servekit.service_auth import ServiceAuthSettings, TokenGate


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

    @app.post("/refuse")
    async def refuse(n: int = 1, retry_after: float | None = None) -> dict[str, Any]:
        engine.refuse_next = n
        engine.refuse_retry_after = retry_after
        return {"refuse_next": n}

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

    seen: list[Any] = []

    @app.get("/priorities")
    async def priorities() -> list[Any]:
        return seen

    wrap_front(app, lambda inner: _BodyPriority(inner, seen))
    return app


class _BodyPriority:
    """Records each completion body's ``priority`` (as vLLM would read it), then replays it."""

    def __init__(self, app: ASGIApp, seen: list[Any]) -> None:
        self.app = app
        self.seen = seen

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["path"] not in PATHS:
            await self.app(scope, receive, send)
            return
        raw = await read_body(receive, 1 << 24, header(scope, b"content-length"))
        try:
            body = json.loads(raw)
        except ValueError:
            body = None
        self.seen.append(body.get("priority") if isinstance(body, dict) else None)
        await self.app(scope, replaying(raw, receive), send)
