"""The gateway over URL replicas that are real HTTP doubles of an engine server.

No model here: the doubles answer instantly unless told to hold, which makes
priority order, failover and health transitions deterministic.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from central.app import create_app
from central.balancer import Balancer, Candidate, prefix_key
from central.settings import CentralSettings
from hybrid_llm.local.engine_double import create_double
from hybrid_llm.local.servers import (
    UvicornThread,
    all_replicas_healthy,
    free_port,
    gateway_replicas,
    wait_ready,
    wait_until,
)
from servekit.engine.protocol import GenerationRequest, Message, SamplingParams

MODEL = "big"


def _settings(tmp_path: Path, urls: list[str], **extra: Any) -> CentralSettings:
    data: dict[str, Any] = {
        "model": MODEL,
        "replicas": [
            {"name": f"r{i}", "kind": "url", "url": u, "load_source": "vllm", "capacity": 1}
            for i, u in enumerate(urls)
        ],
        "supervision": {
            "health_interval_s": 0.1,
            "scrape_interval_s": 0.1,
            "unhealthy_after": 1,
            "log_dir": str(tmp_path),
        },
        "admission": {"max_waiting": 16, "batch_every": 2},
    }
    data.update(extra)
    return CentralSettings.model_validate(data)


def _chat(gw: str, text: str, *, priority: str | None = None, **body: Any) -> httpx.Response:
    headers = {"X-Priority": priority} if priority else {}
    payload = {"model": MODEL, "messages": [{"role": "user", "content": text}], **body}
    return httpx.post(gw + "/v1/chat/completions", json=payload, headers=headers, timeout=30)


@pytest.fixture
def doubles() -> Iterator[tuple[UvicornThread, UvicornThread]]:
    with UvicornThread(create_double(MODEL)) as a, UvicornThread(create_double(MODEL)) as b:
        yield a, b


@pytest.fixture
def gateway_factory(tmp_path: Path) -> Iterator[Callable[[CentralSettings], str]]:
    started: list[UvicornThread] = []

    def start(settings: CentralSettings) -> str:
        server = UvicornThread(create_app(settings)).__enter__()
        started.append(server)
        wait_ready(server.url, timeout=10)
        return server.url

    yield start
    for server in started:
        server.__exit__(None, None, None)


def test_serves_streams_and_scrapes_replica_load(
    doubles: tuple[UvicornThread, UvicornThread],
    gateway_factory: Callable[[CentralSettings], str],
    tmp_path: Path,
) -> None:
    a, b = doubles
    gw = gateway_factory(_settings(tmp_path, [a.url, b.url]))
    wait_until(lambda: all_replicas_healthy(gw), what="healthy")

    r = _chat(gw, "hi", max_tokens=8)
    assert r.status_code == 200
    assert r.json()["choices"][0]["message"]["content"] == "Hello from the double"
    assert r.json()["model"] == MODEL

    with httpx.stream(
        "POST",
        gw + "/v1/chat/completions",
        json={"model": MODEL, "messages": [{"role": "user", "content": "s"}], "stream": True},
    ) as s:
        lines = [line for line in s.iter_lines() if line.startswith("data: ")]
    assert lines[-1] == "data: [DONE]"
    assert len(lines) >= 6

    # A request held on a replica shows up in that replica's scraped vLLM gauges.
    held = threading.Thread(target=_chat, args=(gw, "HOLD me"))
    held.start()
    try:
        wait_until(
            lambda: any(r["engine_running"] == 1 for r in gateway_replicas(gw).values()),
            what="scraped vllm:num_requests_running == 1",
        )
        busy = [r for r in gateway_replicas(gw).values() if r["inflight"] == 1]
        assert len(busy) == 1
        assert busy[0]["engine_running"] == 1
    finally:
        for d in doubles:
            httpx.post(d.url + "/release")
        held.join(10)

    assert _healthy_gauges(gw) == {"r0": 1.0, "r1": 1.0}
    families = _metrics(gw)
    assert all(s.labels["tier"] == "center" for s in families["central_replica_healthy"].samples)
    ttft = families["vllm:time_to_first_token_seconds"]
    assert any(s.labels.get("tier") == "center" for s in ttft.samples)


def test_load_reports_the_speeds_measured_on_replicas_without_a_report(
    doubles: tuple[UvicornThread, UvicornThread],
    gateway_factory: Callable[[CentralSettings], str],
    tmp_path: Path,
) -> None:
    """vLLM's and TensorRT-LLM's metrics carry no TTFT or prefill rate: the
    gateway reports what it measured on the requests it sent, so a router
    prices the center on its own speed instead of a configured default."""
    a, _ = doubles
    gw = gateway_factory(_settings(tmp_path, [a.url]))
    wait_until(lambda: all_replicas_healthy(gw), what="healthy")
    before = httpx.get(gw + "/load").json()
    assert (before["ttft_p50_ms"], before["prefill_tokens_per_s"]) == (None, None)
    assert _chat(gw, "hi", max_tokens=8).status_code == 200
    after = httpx.get(gw + "/load").json()
    assert after["ttft_p50_ms"] > 0
    assert after["ttft_p95_ms"] >= after["ttft_p50_ms"]
    assert after["prefill_tokens_per_s"] > 0
    assert after["decode_tokens_per_s"] > 0


def _metrics(gw: str) -> dict[str, Any]:
    text = httpx.get(gw + "/metrics").text
    return {f.name: f for f in text_string_to_metric_families(text)}


def _healthy_gauges(gw: str) -> dict[str, float]:
    samples = _metrics(gw)["central_replica_healthy"].samples
    return {s.labels["replica"]: s.value for s in samples}


def _prompt_homed_on(settings: CentralSettings, name: str) -> str:
    """A prompt whose prefix hashes to replica ``name`` on the gateway's ring."""
    names = [r.name for r in settings.replicas]
    balancer = Balancer(settings.balancing, names)
    idle = [Candidate(n, 1) for n in names]
    for i in range(1000):
        text = f"question {i}"
        req = GenerationRequest("x", SamplingParams(), messages=(Message("user", text),))
        chosen = balancer.choose(idle, prefix_key(req, settings.balancing.prefix_chars))
        if chosen is not None and chosen.name == name:
            return text
    raise AssertionError("no prompt hashes there")


def test_failure_before_the_first_token_is_retried_on_another_replica(
    doubles: tuple[UvicornThread, UvicornThread],
    gateway_factory: Callable[[CentralSettings], str],
    tmp_path: Path,
) -> None:
    a, b = doubles
    settings = _settings(tmp_path, [a.url, b.url])
    gw = gateway_factory(settings)
    wait_until(lambda: all_replicas_healthy(gw), what="healthy")
    text = _prompt_homed_on(settings, "r0")
    httpx.post(a.url + "/fail", params={"n": 1})

    r = _chat(gw, text)
    assert r.status_code == 200
    assert r.json()["choices"][0]["message"]["content"] == "Hello from the double"
    # It reached r0 first (and failed there), then r1 answered.
    assert httpx.get(a.url + "/arrivals").json() == [text]
    assert httpx.get(b.url + "/arrivals").json() == [text]
    retries = _metrics(gw)["central_dispatch_retries"].samples
    assert [s.value for s in retries if s.name == "central_dispatch_retries_total"] == [1.0]
    replicas = gateway_replicas(gw)
    assert (replicas["r0"]["served"], replicas["r1"]["served"]) == (0, 1)

    # When every replica fails, the client gets the upstream error, not a hang.
    httpx.post(a.url + "/fail", params={"n": 1})
    httpx.post(b.url + "/fail", params={"n": 1})
    r = _chat(gw, text)
    assert r.status_code >= 500
    assert "error" in r.json()


def test_an_answer_broken_mid_stream_continues_on_another_replica(
    doubles: tuple[UvicornThread, UvicornThread],
    gateway_factory: Callable[[CentralSettings], str],
    tmp_path: Path,
) -> None:
    a, b = doubles
    gw = gateway_factory(_settings(tmp_path, [a.url, b.url]))
    wait_until(lambda: all_replicas_healthy(gw), what="healthy")
    body = {
        "model": MODEL,
        "messages": [{"role": "user", "content": "BREAK please"}],
        "max_tokens": 10,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    with httpx.stream("POST", gw + "/v1/chat/completions", json=body) as s:
        assert s.status_code == 200
        events = [json.loads(line[6:]) for line in s.iter_lines()
                  if line.startswith("data: {")]  # fmt: skip
    text = "".join(e["choices"][0]["delta"].get("content") or "" for e in events if e["choices"])
    # Two tokens from the replica that died, then the rest from the other one,
    # which was asked to continue the partial assistant message.
    assert text == "Hello from" + "Hello from the double"
    assert not any("error" in e for e in events)
    assert events[-1]["usage"]["completion_tokens"] == 2 + 4
    calls = httpx.get(a.url + "/requests").json() + httpx.get(b.url + "/requests").json()
    assert len(calls) == 2
    resumed = next(c for c in calls if c["continue_final_message"])
    assert resumed["messages"] == [["user", "BREAK please"], ["assistant", "Hello from"]]
    assert resumed["max_tokens"] == 8
    # Non-streaming clients get the whole answer too.
    r = _chat(gw, "BREAK again", max_tokens=10)
    assert r.status_code == 200
    assert r.json()["choices"][0]["message"]["content"] == "Hello from" + "Hello from the double"


def test_interactive_goes_first_and_batch_is_not_starved(
    gateway_factory: Callable[[CentralSettings], str], tmp_path: Path
) -> None:
    with UvicornThread(create_double(MODEL)) as double:
        gw = gateway_factory(_settings(tmp_path, [double.url]))
        wait_until(lambda: gateway_replicas(gw)["r0"]["state"] == "healthy", what="healthy")

        threads: list[threading.Thread] = []

        def send(text: str, priority: str) -> None:
            t = threading.Thread(target=_chat, args=(gw, text), kwargs={"priority": priority})
            t.start()
            threads.append(t)

        def gateway_load() -> dict[str, Any]:
            load: dict[str, Any] = httpx.get(gw + "/load").json()
            return load

        # One replica of capacity 1: the held request saturates the center.
        send("HOLD", "interactive")
        wait_until(lambda: gateway_load()["running"] == 1, what="held request running")
        # Queue batch first, then two interactive ones, one at a time so the
        # order of arrival at the gateway is known.
        for i, (text, priority) in enumerate(
            [("batch-1", "batch"), ("inter-1", "interactive"), ("inter-2", "interactive")]
        ):
            send(text, priority)
            wait_until(lambda n=i + 1: gateway_load()["waiting"] == n, what=f"{i + 1} waiting")
        httpx.post(double.url + "/release")
        for t in threads:
            t.join(10)
        order = httpx.get(double.url + "/arrivals").json()
    # Interactive jumps the queue; with batch_every=2 the second grant is batch's.
    assert order == ["HOLD", "inter-1", "batch-1", "inter-2"]


def test_priority_reaches_replicas_that_schedule_by_it(
    doubles: tuple[UvicornThread, UvicornThread],
    gateway_factory: Callable[[CentralSettings], str],
    tmp_path: Path,
) -> None:
    a, b = doubles
    settings = _settings(tmp_path, [a.url, b.url])
    settings.replicas[0].send_priority = True  # type: ignore[union-attr]
    gw = gateway_factory(settings)
    wait_until(lambda: all_replicas_healthy(gw), what="healthy")

    def priorities(double: UvicornThread) -> list[int | None]:
        got: list[int | None] = httpx.get(double.url + "/priorities").json()
        return got

    def send_to(name: str, double: UvicornThread, priority: str | None) -> None:
        # The ring homes the prompt there; a replica that looks busy for a moment
        # (a load probe late on a loaded machine) is passed over, so send again.
        for _ in range(5):
            before = len(priorities(double))
            assert _chat(gw, _prompt_homed_on(settings, name), priority=priority).status_code == 200
            if len(priorities(double)) > before:
                return
        pytest.fail(f"no request reached {name}")

    for priority in ("batch", "interactive", None):
        send_to("r0", a, priority)
        send_to("r1", b, priority)
    # vLLM's `priority`: lower is served first; only r0 is configured to get it.
    assert priorities(a) == [1, 0, 0]
    assert set(priorities(b)) == {None}


def test_no_healthy_replica_is_503_with_retry_after(tmp_path: Path) -> None:
    settings = _settings(tmp_path, [f"http://127.0.0.1:{free_port()}"])
    settings.supervision.dispatch_wait_s = 0.2
    app = create_app(settings)
    with UvicornThread(app) as gw:
        ready = httpx.get(gw.url + "/ready")
        assert ready.status_code == 503
        r = _chat(gw.url, "anyone?")
        assert r.status_code == 503
        assert r.json()["error"]["code"] == "not_ready"
        assert int(r.headers["retry-after"]) >= 1
        assert gateway_replicas(gw.url)["r0"]["state"] == "starting"


def test_unhealthy_replica_leaves_rotation_and_rejoins(
    gateway_factory: Callable[[CentralSettings], str], tmp_path: Path
) -> None:
    port = free_port()
    with UvicornThread(create_double(MODEL)) as a:
        b = UvicornThread(create_double(MODEL), port=port).__enter__()
        gw = gateway_factory(_settings(tmp_path, [a.url, b.url]))
        wait_until(lambda: gateway_replicas(gw)["r1"]["state"] == "healthy", what="r1 healthy")
        b.__exit__(None, None, None)
        wait_until(
            lambda: gateway_replicas(gw)["r1"]["state"] == "unhealthy", what="r1 out of rotation"
        )
        for i in range(4):
            assert _chat(gw, f"while r1 is down {i}").status_code == 200
        assert gateway_replicas(gw)["r1"]["served"] == 0
        assert _healthy_gauges(gw) == {"r0": 1.0, "r1": 0.0}
        with UvicornThread(create_double(MODEL), port=port):
            wait_until(lambda: gateway_replicas(gw)["r1"]["state"] == "healthy", what="r1 back")
            assert httpx.get(gw + "/ready").status_code == 200


def test_a_replicas_retry_after_is_its_back_off(
    doubles: tuple[UvicornThread, UvicornThread],
    gateway_factory: Callable[[CentralSettings], str],
    tmp_path: Path,
) -> None:
    """A 429 with ``Retry-After: 30`` ranks the replica last for 30 s, as the router
    ranks its instances (tests/geo_router/test_failover.py): the prompt's home replica
    refused once, so the next requests go to the other one instead of queueing there."""
    a, b = doubles
    settings = _settings(tmp_path, [a.url, b.url])
    gw = gateway_factory(settings)
    wait_until(lambda: all_replicas_healthy(gw), what="healthy")
    text = _prompt_homed_on(settings, "r0")
    httpx.post(a.url + "/refuse", params={"n": 1, "retry_after": 30})
    for _ in range(3):
        r = _chat(gw, text)
        assert r.status_code == 200, r.text
    assert httpx.get(a.url + "/arrivals").json() == [text]  # refused once, then left alone
    assert httpx.get(b.url + "/arrivals").json() == [text] * 3
    # A refusal that every replica gives reaches the client with its Retry-After.
    httpx.post(b.url + "/refuse", params={"n": 2, "retry_after": 7})
    httpx.post(a.url + "/refuse", params={"n": 1, "retry_after": 7})
    r = _chat(gw, text)
    assert r.status_code == 429, r.text
    assert r.headers["retry-after"] == "7"
