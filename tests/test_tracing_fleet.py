"""One request, one trace: router → edge agent or central gateway → engine.

The router, an edge agent (scripted engine) and a central gateway (over an
engine double) each run on a real socket with tracing on, exporting over
OTLP/HTTP to an in-test receiver that decodes the protobuf as a collector
would. Each service has its own tracer provider, so the only link between
their spans is the ``traceparent`` header crossing each hop.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import httpx
import pytest

from central.app import create_app as create_central
from central.settings import CentralSettings
from geo_router.app import create_app as create_router
from hybrid_llm.local.engine_double import create_double
from hybrid_llm.local.servers import UvicornThread, wait_ready
from servekit.asgi import ASGIApp, Receive, Scope, Send, header
from tests.edge_agent.conftest import scripted_app, settings_from
from tests.geo_router.conftest import KEY, router_settings, upstream
from tests.support.otlp import OtlpReceiver, ReceivedSpan

SECRET_PROMPT = "zebra-quartz-7781 tell me the capital of France"
CLIENT_TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"
CLIENT_PARENT = "00f067aa0ba902b7"
INTAKE = ("router.auth", "router.body", "router.limit", "router.region", "router.plan")


class TraceparentRecorder:
    """The engine double, keeping the traceparent of every completion it is sent."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app
        self.seen: list[str | None] = []

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["path"].endswith("/completions"):
            self.seen.append(header(scope, b"traceparent"))
        await self.app(scope, receive, send)


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    tmp = tmp_path_factory.mktemp("tracing")
    with ExitStack() as stack:
        receiver = stack.enter_context(OtlpReceiver())
        tracing = {"enabled": True, "endpoint": receiver.endpoint, "export_delay_ms": 50}
        stand_in = tmp / "stand-in.gguf"
        stand_in.write_bytes(b"GGUF scripted")
        edge = stack.enter_context(
            UvicornThread(
                scripted_app(settings_from(stand_in, instance__id="edge-east", tracing=tracing))
            )
        )
        engine = TraceparentRecorder(create_double("big"))
        replica = stack.enter_context(UvicornThread(engine))
        central = CentralSettings.model_validate(
            {
                "model": "big",
                "replicas": [{"name": "r0", "kind": "url", "url": replica.url, "capacity": 1}],
                "supervision": {"health_interval_s": 0.1, "log_dir": str(tmp)},
                "instance": {"id": "center-1"},
                # A budget, so admission predicts (and the span says what).
                "admission": {"ttft_budget_ms": 60_000},
                "tracing": tracing,
            }
        )
        center = stack.enter_context(UvicornThread(create_central(central)))
        ups = [
            upstream(edge.url, id="edge-east"),
            upstream(center.url, tier="center", region="center", id="center-1"),
        ]
        router = stack.enter_context(
            UvicornThread(create_router(router_settings(ups, tracing=tracing)))
        )
        for server in (edge, center, router):
            wait_ready(server.url, timeout=30)
        yield {"router": router.url, "receiver": receiver, "engine": engine}


def _chat(router: str, model: str, **headers: str) -> httpx.Response:
    body = {"model": model, "messages": [{"role": "user", "content": SECRET_PROMPT}]}
    body["max_tokens"] = 4
    auth = {"Authorization": f"Bearer {KEY}", **headers}
    r = httpx.post(router + "/v1/chat/completions", json=body, headers=auth, timeout=30)
    assert r.status_code == 200, r.text
    return r


def _trace(receiver: OtlpReceiver, trace_id: str, *names: str) -> list[ReceivedSpan]:
    """The trace's spans once its ``router.request`` and each of ``names`` arrived.

    Each service's batch exporter sends a span when it ends; a parent ends after
    its children and may come in a later batch, so a test waits for every span
    it reads, not only for the last one to begin."""

    def complete(spans: list[ReceivedSpan]) -> bool:
        seen = {s.name for s in spans if s.trace_id == trace_id}
        return {"router.request", *names} <= seen

    return [s for s in receiver.wait_for(complete) if s.trace_id == trace_id]


def _one(spans: list[ReceivedSpan], name: str) -> ReceivedSpan:
    found = [s for s in spans if s.name == name]
    assert len(found) == 1, (name, [s.name for s in spans])
    return found[0]


def _no_secrets(spans: list[ReceivedSpan]) -> None:
    for s in spans:
        for key, value in s.attributes.items():
            text = str(value)
            assert "zebra-quartz" not in text, (s.name, key)
            assert KEY not in text, (s.name, key)


def test_one_trace_from_the_client_through_router_and_edge(fleet: dict[str, Any]) -> None:
    traceparent = f"00-{CLIENT_TRACE}-{CLIENT_PARENT}-01"
    r = _chat(fleet["router"], "edge", traceparent=traceparent)
    assert r.headers["x-route-instance"] == "edge-east"
    spans = _trace(fleet["receiver"], CLIENT_TRACE, "serve.request", "serve.decode")
    request = _one(spans, "router.request")
    assert request.parent_id == CLIENT_PARENT  # the client's trace, continued
    assert request.service == "geo-router"
    assert request.attributes["request.id"] == r.headers["x-request-id"]
    assert request.attributes["route.tier"] == "edge"
    for name in INTAKE:
        assert _one(spans, name).parent_id == request.span_id
    attempt = _one(spans, "router.attempt")
    assert attempt.parent_id == request.span_id
    assert attempt.attributes["route.instance"] == "edge-east"
    assert attempt.attributes["attempt.outcome"] == "ok"
    assert "first_token" in attempt.events
    served = _one(spans, "serve.request")
    assert served.service == "edge-agent"
    assert served.parent_id == attempt.span_id  # across the hop, through traceparent
    assert served.attributes["serve.tier"] == "edge"
    assert served.attributes["serve.prompt_tokens"] > 0
    assert served.attributes["request.id"] == r.headers["x-request-id"]
    for stage in ("serve.queue", "serve.prefill", "serve.decode"):
        assert _one(spans, stage).parent_id == served.span_id
    # Causal order (one machine, one clock); the edge may end its span after the
    # router read [DONE], so only starts are ordered across the hop.
    assert request.start_ns <= attempt.start_ns <= served.start_ns
    assert attempt.end_ns <= request.end_ns
    assert not any(s.error for s in spans), [(s.name, s.status) for s in spans if s.error]
    assert "cancelled" not in served.attributes  # the router closing after [DONE] is no cancel
    assert "serve.own_prefill_ms" not in served.attributes  # no budget, no prediction
    _no_secrets(spans)


def test_a_center_request_reaches_the_engine_in_the_same_trace(fleet: dict[str, Any]) -> None:
    r = _chat(fleet["router"], "center")
    assert r.headers["x-route-tier"] == "center"
    receiver: OtlpReceiver = fleet["receiver"]
    requests = receiver.wait_for(
        lambda spans: any(
            s.name == "router.request"
            and s.attributes.get("request.id") == r.headers["x-request-id"]
            for s in spans
        )
    )
    trace_id = next(
        s.trace_id
        for s in requests
        if s.name == "router.request" and s.attributes["request.id"] == r.headers["x-request-id"]
    )
    spans = _trace(receiver, trace_id, "serve.request", "serve.decode")
    assert {s.service for s in spans} == {"geo-router", "central"}
    attempt = _one(spans, "router.attempt")
    served = _one(spans, "serve.request")
    assert served.parent_id == attempt.span_id
    assert served.attributes["serve.tier"] == "center"
    # Admitted under a budget: the span keeps the prediction it was admitted on
    # (the router sent its prefill count; the idle gateway predicts no wait).
    assert served.attributes["serve.predicted_wait_ms"] == 0.0
    assert served.attributes["serve.own_prefill_ms"] >= 0.0
    # The gateway hands its own span on to the engine (vLLM would continue it).
    sent = fleet["engine"].seen[-1]
    assert sent is not None
    assert sent.split("-")[1:3] == [trace_id, served.span_id]
    _no_secrets(spans)


def test_server_timing_names_the_stages(fleet: dict[str, Any]) -> None:
    began = time.perf_counter()
    r = _chat(fleet["router"], "auto")
    elapsed_ms = (time.perf_counter() - began) * 1e3
    stages = [part.split(";")[0].strip() for part in r.headers["server-timing"].split(",")]
    assert stages == ["auth", "body", "limit", "region", "classify", "plan", "upstream"]
    durations = [float(p.split("dur=")[1]) for p in r.headers["server-timing"].split(",")]
    assert all(d >= 0 for d in durations)
    assert sum(durations) <= elapsed_ms  # stages in order, inside what the client waited
    metrics = httpx.get(fleet["router"] + "/metrics", timeout=10).text
    for stage in stages:  # the same stages as histograms
        assert f'router_stage_seconds_count{{stage="{stage}"}}' in metrics, stage


def test_an_untraced_service_still_answers_with_server_timing(tmp_path: Path) -> None:
    stand_in = tmp_path / "stand-in.gguf"
    stand_in.write_bytes(b"GGUF scripted")
    with UvicornThread(scripted_app(settings_from(stand_in))) as edge:
        wait_ready(edge.url, timeout=30)
        body = {"model": "edge", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
        r = httpx.post(edge.url + "/v1/chat/completions", json=body, timeout=30)
    assert r.status_code == 200, r.text
    assert [p.split(";")[0] for p in r.headers["server-timing"].split(", ")] == [
        "queue",
        "prefill",
    ]
