"""serve_generation's order of things, on the scripted engine."""

from __future__ import annotations

import pytest
from prometheus_client import CollectorRegistry

from hybrid_llm.local.scripted_engine import ScriptedEngine
from servekit.admission import AdmissionQueue
from servekit.api import FixedEngine, ServingCore
from servekit.api.generation import serve_generation
from servekit.asgi import Message as AsgiMessage
from servekit.engine.protocol import GenerationRequest, Message, SamplingParams
from servekit.metrics import ServingMetrics

pytestmark = pytest.mark.anyio


@pytest.mark.parametrize("stream", [True, False])
async def test_the_slot_is_free_before_the_client_sees_the_answer_end(stream: bool) -> None:
    """A client (a router one request at a time) sends its next request as soon as
    it reads the end; a queue still counting the last one is not idle, and the
    center refused a long prompt it takes only when idle."""
    engine = ScriptedEngine("m")
    await engine.start()
    admission = AdmissionQueue(1, 4)
    metrics = ServingMetrics(
        CollectorRegistry(), model="m", version="", region="r", tier="edge", load=engine.load
    )
    core = ServingCore(FixedEngine(engine), admission, metrics)
    running_at_end: list[int] = []

    async def send(message: AsgiMessage) -> None:
        if message["type"] == "http.response.body" and not message.get("more_body", False):
            running_at_end.append(admission.running)

    request = GenerationRequest(
        "r1", SamplingParams(max_tokens=4), messages=(Message("user", "hello"),)
    )
    await serve_generation(core, request, send, stream=stream, include_usage=False, arrival=0.0)
    assert running_at_end == [0]
    assert admission.idle
