"""servekit.tracing: off costs nothing and needs no SDK; on, it samples and propagates."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from servekit.tracing import OFF, TracingSettings, start_tracing

REPO = Path(__file__).resolve().parents[2]
PARENT = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"

_WITHOUT_SDK = """
import importlib.abc, sys
class Blocker(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.startswith(("opentelemetry.sdk", "opentelemetry.exporter")):
            raise ModuleNotFoundError(f"No module named {name!r} (blocked)", name=name)
        return None
sys.meta_path.insert(0, Blocker())
import central.app, edge_agent.app, geo_router.app
from servekit.tracing import OFF, TracingSettings, start_tracing
assert start_tracing(TracingSettings(), "x") is OFF
try:
    start_tracing(TracingSettings(enabled=True), "x")
except RuntimeError as exc:
    assert "hybrid-llm[tracing]" in str(exc), exc
else:
    raise AssertionError("enabled without the SDK")
assert not [m for m in sys.modules if m.startswith("opentelemetry.sdk")]
"""


def test_the_services_start_without_the_tracing_extra() -> None:
    done = subprocess.run(
        [sys.executable, "-c", _WITHOUT_SDK], cwd=REPO, capture_output=True, text=True, check=False
    )
    assert done.returncode == 0, done.stderr[-2000:]


def test_off_by_default() -> None:
    assert start_tracing(TracingSettings(), "svc") is OFF
    assert not OFF.enabled


def _spans(settings: TracingSettings, headers: dict[str, str]) -> InMemorySpanExporter:
    exporter = InMemorySpanExporter()
    tracing = start_tracing(settings, "svc", {"hybrid_llm.tier": "edge"}, exporter=exporter)
    assert tracing.enabled
    span = tracing.start("serve.request", headers=headers, server=True)
    began = time.perf_counter()
    tracing.record("serve.queue", span, began, began + 0.25)
    span.end()
    tracing.shutdown()
    return exporter


def test_a_callers_sampled_trace_is_continued_whatever_the_ratio() -> None:
    settings = TracingSettings(enabled=True, sample_ratio=0.0)
    assert _spans(settings, {}).get_finished_spans() == ()
    spans = _spans(settings, {"traceparent": PARENT}).get_finished_spans()
    assert {s.name for s in spans} == {"serve.request", "serve.queue"}
    request = next(s for s in spans if s.name == "serve.request")
    assert f"{request.context.trace_id:032x}" == PARENT.split("-")[1]
    assert request.parent is not None
    assert f"{request.parent.span_id:016x}" == PARENT.split("-")[2]
    assert request.resource.attributes["service.name"] == "svc"
    assert request.resource.attributes["hybrid_llm.tier"] == "edge"


def test_an_untrusted_caller_starts_a_new_trace() -> None:
    settings = TracingSettings(enabled=True, trust_incoming=False, service_name="edge-1")
    spans = _spans(settings, {"traceparent": PARENT}).get_finished_spans()
    request = next(s for s in spans if s.name == "serve.request")
    assert request.parent is None
    assert f"{request.context.trace_id:032x}" != PARENT.split("-")[1]
    assert request.resource.attributes["service.name"] == "edge-1"


def test_a_recorded_stage_keeps_its_own_times() -> None:
    spans = _spans(TracingSettings(enabled=True), {}).get_finished_spans()
    queue = next(s for s in spans if s.name == "serve.queue")
    request = next(s for s in spans if s.name == "serve.request")
    assert queue.parent is not None
    assert queue.parent.span_id == request.context.span_id
    assert queue.end_time is not None
    assert queue.start_time is not None
    assert queue.end_time - queue.start_time == pytest.approx(250_000_000, abs=1000)
    assert abs(queue.start_time - time.time_ns()) < 5e9  # epoch time, not perf_counter


def test_inject_writes_the_span_as_the_upstream_parent() -> None:
    exporter = InMemorySpanExporter()
    tracing = start_tracing(TracingSettings(enabled=True), "svc", exporter=exporter)
    span = tracing.start("router.attempt")
    headers: dict[str, str] = {}
    tracing.inject(span, headers)
    ctx = span.get_span_context()
    version, trace_id, parent, flags = headers["traceparent"].split("-")
    assert (version, trace_id, parent) == ("00", f"{ctx.trace_id:032x}", f"{ctx.span_id:016x}")
    assert int(flags, 16) & 1  # sampled
    span.end()
    tracing.shutdown()


def test_a_client_error_is_described_without_its_message() -> None:
    from servekit.errors import InvalidRequest, UpstreamUnavailable
    from servekit.tracing import mark_failed

    exporter = InMemorySpanExporter()
    tracing = start_tracing(TracingSettings(enabled=True), "svc", exporter=exporter)
    client, upstream = tracing.start("client"), tracing.start("upstream")
    mark_failed(client, InvalidRequest("the prompt 'my secret plan' is bad", param="messages"))
    mark_failed(upstream, UpstreamUnavailable("http://edge-1:8101: connection refused"))
    client.end()
    upstream.end()
    tracing.shutdown()
    spans = {s.name: s.status.description or "" for s in exporter.get_finished_spans()}
    assert "secret" not in spans["client"]
    assert "param=messages" in spans["client"]
    assert "connection refused" in spans["upstream"]
