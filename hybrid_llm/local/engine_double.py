"""A real HTTP double of an engine replica (think: a vLLM server we can script).

Tests of the central gateway and ``studies/central_overhead.py`` stand
replicas up with it where a real engine would only add noise.

It is an OpenAI-compatible server on a real socket, built with the shared
serving layer over a scripted engine, so its ``/health``, ``/metrics``
(``vllm:num_requests_running`` / ``_waiting`` gauges) and SSE are what a
replica looks like on the wire. Prompts starting with ``HOLD`` block until
``POST /release``; ``POST /fail?n=N`` makes the next N generations fail before
their first token; prompts starting with ``BREAK`` fail after two tokens.
Every prompt is recorded, in arrival order, at ``/arrivals``,
and the body's ``priority`` field (vLLM's) at ``/priorities``.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from fastapi import FastAPI
from prometheus_client import CollectorRegistry

from servekit.admission import AdmissionQueue
from servekit.api import FixedEngine, ServingCore, build_serving_app
from servekit.engine.protocol import (
    Finish,
    GenerationEvent,
    GenerationRequest,
    LoadReport,
    TextDelta,
)
from servekit.errors import EngineFailure
from servekit.metrics import ServingMetrics
from servekit.service_auth import ServiceAuthSettings, TokenGate

__all__ = ["TOKENS", "ScriptedEngine", "create_double"]

TOKENS = ("Hello", " from", " the", " double")


class ScriptedEngine:
    def __init__(self, model: str) -> None:
        self.model_name = model
        self.capacity = 64
        self.arrivals: list[str] = []
        self.priorities: list[Any] = []
        self.requests: list[GenerationRequest] = []
        self.fail_next = 0
        self.release = asyncio.Event()

    async def start(self) -> None:
        return None

    async def ready(self) -> bool:
        return True

    async def aclose(self) -> None:
        return None

    def load(self) -> LoadReport:
        return LoadReport(ready=True, model=self.model_name)

    def generate(self, request: GenerationRequest) -> AsyncIterator[GenerationEvent]:
        return self._generate(request)

    async def _generate(self, request: GenerationRequest) -> AsyncIterator[GenerationEvent]:
        text = request.messages[-1].content if request.messages else (request.prompt or "")
        self.arrivals.append(text)
        self.priorities.append(request.extra.get("priority"))
        self.requests.append(request)
        if self.fail_next > 0:
            self.fail_next -= 1
            raise EngineFailure("scripted failure")
        if text.startswith("HOLD"):
            await self.release.wait()
        if text.startswith("BREAK"):
            # Die mid-answer, after the first two tokens went out.
            yield TextDelta(TOKENS[0], 1)
            yield TextDelta(TOKENS[1], 1)
            raise EngineFailure("scripted crash mid-answer")
        for token in TOKENS:
            yield TextDelta(token, 1)
        yield Finish("stop", prompt_tokens=3, completion_tokens=len(TOKENS))


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
