"""vLLM's own span in a routed request's trace.

A router (in process) and an `edge-agent serve` process on a real `vllm serve`
(CPU build) all export to one real OTLP/HTTP receiver, as they would to
Phoenix or a collector. The agent gives vLLM the same endpoint
(``--otlp-traces-endpoint``) and sends the request's ``traceparent`` on, so
vLLM's ``llm_request`` span is the child of the agent's ``serve.request``.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from contextlib import ExitStack
from pathlib import Path

import httpx
import pytest

from geo_router.app import create_app as create_router
from hybrid_llm.local.servers import UvicornThread, free_port, service_process, wait_ready
from tests.geo_router.conftest import KEY, router_settings, upstream
from tests.support.otlp import OtlpReceiver, ReceivedSpan
from tests.support.vllm import require_vllm, vllm_engine, write_edge_config

pytestmark = [pytest.mark.vllm, pytest.mark.slow]

SECRET_PROMPT = "zebra-quartz-7781 name one river"
MAX_TOKENS = 4


def _one(spans: Sequence[ReceivedSpan], name: str) -> ReceivedSpan:
    found = [s for s in spans if s.name == name]
    assert len(found) == 1, (name, sorted(s.name for s in spans))
    return found[0]


def test_vllms_llm_request_span_joins_the_routed_requests_trace(tmp_path: Path) -> None:
    require_vllm()
    trace_id = os.urandom(16).hex()
    with OtlpReceiver() as receiver, ExitStack() as stack:
        tracing = {"enabled": True, "endpoint": receiver.endpoint, "export_delay_ms": 50}
        port = free_port()
        edge_url = f"http://127.0.0.1:{port}"
        config = write_edge_config(
            tmp_path / "edge.yaml", port, vllm_engine(tmp_path), tracing=tracing
        )
        args = ["edge_agent", "serve", "--config", str(config)]
        stack.enter_context(service_process(args, edge_url, ready_timeout=420))
        settings = router_settings(
            [upstream(edge_url, id="edge-vllm-test")],
            tracing=tracing,
            routing={"ttft_deadline_s": 30.0},
        )
        router = stack.enter_context(UvicornThread(create_router(settings)))
        wait_ready(router.url, timeout=60)
        body = {"model": "edge", "max_tokens": MAX_TOKENS, "temperature": 0, "stream": True}
        body["messages"] = [{"role": "user", "content": SECRET_PROMPT}]
        headers = {"Authorization": f"Bearer {KEY}", "traceparent": f"00-{trace_id}-{'1' * 16}-01"}
        r = httpx.post(router.url + "/v1/chat/completions", json=body, headers=headers, timeout=60)
        assert r.status_code == 200, r.text
        # vLLM's batch exporter sends every 5 s; the services' every 50 ms.
        wanted = {"llm_request", "serve.request", "router.request"}
        spans = receiver.wait_for(
            lambda got: wanted <= {s.name for s in got if s.trace_id == trace_id}, timeout=60
        )

    ours = sorted((s for s in spans if s.trace_id == trace_id), key=lambda s: s.start_ns)
    for span in ours:  # the figures for a reader of the run (pytest -s)
        took = (span.end_ns - span.start_ns) / 1e6
        print(f"{span.service:12} {span.name:22} {took:8.1f} ms  parent {span.parent_id}")
    request, attempt = _one(ours, "router.request"), _one(ours, "router.attempt")
    served, engine = _one(ours, "serve.request"), _one(ours, "llm_request")
    assert attempt.parent_id == request.span_id
    assert served.parent_id == attempt.span_id
    assert engine.parent_id == served.span_id  # vLLM continued the agent's traceparent
    assert engine.service == "vllm"
    assert engine.attributes["gen_ai.usage.completion_tokens"] == MAX_TOKENS
    assert engine.attributes["gen_ai.usage.prompt_tokens"] == served.attributes.get(
        "serve.prompt_tokens"
    )
    # vLLM's span lies within the agent's: the engine's time is part of the request's.
    assert served.start_ns <= engine.start_ns
    assert engine.end_ns <= served.end_ns + 5_000_000
    # vLLM traces only what its service traces: its warm-up left no trace of its own.
    assert [s.trace_id for s in spans if s.name == "llm_request"] == [trace_id]
    for span in spans:
        assert "zebra-quartz" not in repr(span.attributes), span.name
