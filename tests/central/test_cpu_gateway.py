"""End to end on the CPU config: `central serve` as a subprocess, two stand-in
replicas (edge agents as its subprocesses) serving the real GGUF model.

One gateway serves the whole module; the kill test runs last and waits for
the replica to come back.
"""

from __future__ import annotations

import os
import signal
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import httpx
import openai
import pytest
import yaml

from hybrid_llm.local.servers import (
    REPO,
    all_replicas_healthy,
    free_port,
    gateway_replicas,
    service_process,
    wait_until,
)

pytestmark = [pytest.mark.model, pytest.mark.slow]

MODEL = "smollm2-135m-instruct"
SYSTEM = "You are a terse assistant. Answer in one short sentence."


def _chat(gw: str, user: str, max_tokens: int = 4) -> httpx.Response:
    body = {
        "model": MODEL,
        "messages": [{"role": "system", "content": SYSTEM}, {"role": "user", "content": user}],
        "max_tokens": max_tokens,
        "temperature": 0,
    }
    return httpx.post(gw + "/v1/chat/completions", json=body, timeout=60)


@pytest.fixture(scope="module")
def gateway(model_path: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    config = yaml.safe_load((REPO / "configs" / "central-cpu.yaml").read_text())
    run = tmp_path_factory.mktemp("central-cpu")
    config["supervision"]["log_dir"] = str(run / "logs")
    config["registry"]["embedded"]["path"] = str(run / "registry.db")
    config["registry"]["heartbeat_interval_s"] = 0.3
    for replica in config["replicas"]:
        replica["model_path"] = str(model_path)
    path = run / "central-cpu.yaml"
    path.write_text(yaml.safe_dump(config))
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    args = ["central", "serve", "--config", str(path), "--port", str(port)]
    with service_process(args, url, ready_timeout=120):
        wait_until(lambda: all_replicas_healthy(url), 120, "both replicas healthy")
        yield url
    # It left the registry on the way out.
    assert _center_instances(run / "registry.db") == []


def _center_instances(path: Path) -> list[Any]:
    from servekit.registry import RegistrySettings, open_registry

    settings = RegistrySettings.model_validate({"embedded": {"path": str(path)}})

    async def read() -> list[Any]:
        registry = await open_registry(settings)
        try:
            return await registry.instances(tier="center", healthy_only=False)
        finally:
            await registry.aclose()

    return anyio.run(read)


def test_openai_sdk_against_the_gateway(gateway: str) -> None:
    client = openai.OpenAI(base_url=gateway + "/v1", api_key="unused", max_retries=0)
    assert [m.id for m in client.models.list()] == [MODEL]
    chat = client.chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": "Say hello."}],
        max_tokens=8,
        temperature=0,
    )
    assert chat.choices[0].message.content
    assert chat.usage is not None
    assert 0 < chat.usage.completion_tokens <= 8
    stream = client.chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": "Count to three."}],
        max_tokens=8,
        stream=True,
        stream_options={"include_usage": True},
    )
    chunks = list(stream)
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text
    assert chunks[-1].usage is not None
    completion = client.completions.create(model=MODEL, prompt="The sky is", max_tokens=4)
    assert completion.choices[0].text


def test_bad_requests_are_openai_errors(gateway: str) -> None:
    client = openai.OpenAI(base_url=gateway + "/v1", api_key="unused", max_retries=0)
    with pytest.raises(openai.NotFoundError):
        client.chat.completions.create(
            model="nope", messages=[{"role": "user", "content": "x"}], max_tokens=2
        )
    r = httpx.post(gateway + "/v1/chat/completions", json={"model": MODEL, "messages": "x"})
    assert r.status_code == 400
    assert r.json()["error"]["param"] == "messages"


def test_repeated_system_prompt_sticks_to_one_replica(gateway: str) -> None:
    before = {n: r["served"] for n, r in gateway_replicas(gateway).items()}
    for question in ("What is rain?", "What is snow?", "What is hail?"):
        assert _chat(gateway, question).status_code == 200
    after = {n: r["served"] for n, r in gateway_replicas(gateway).items()}
    deltas = sorted(after[n] - before[n] for n in after)
    assert deltas == [0, 3]


def test_concurrent_load_spreads_across_replicas(gateway: str) -> None:
    before = {n: r["served"] for n, r in gateway_replicas(gateway).items()}
    questions = ("Why?", "How?", "When?", "Where?")
    barrier = threading.Barrier(len(questions))
    codes: list[int] = []

    def one(question: str) -> None:
        barrier.wait()
        codes.append(_chat(gateway, question, max_tokens=16).status_code)

    threads = [threading.Thread(target=one, args=(q,)) for q in questions]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert codes == [200] * len(questions)
    after = {n: r["served"] for n, r in gateway_replicas(gateway).items()}
    # Same system prompt, one home replica; but past its bounded share of the
    # load (1.25x an even split) the rest go to the other replica.
    deltas = sorted(after[n] - before[n] for n in after)
    assert sum(deltas) == len(questions)
    assert deltas[0] >= 1


def test_registered_as_center_with_aggregate_load(
    gateway: str, tmp_path_factory: pytest.TempPathFactory
) -> None:
    db = next(tmp_path_factory.getbasetemp().glob("central-cpu*/registry.db"))
    found = _center_instances(db)
    assert [s.info.id for s in found] == ["central-local"]
    info = found[0].info
    assert (info.tier, info.region, info.model, info.version) == ("center", "center", MODEL, "q4_1")
    assert info.url == gateway
    assert info.capacity == 8  # two replicas batching four sequences each
    assert info.tags == ("llamacpp",)
    before = found[0].load.requests_ok
    assert _chat(gateway, "Register me.").status_code == 200

    def beat_carried_it() -> bool:
        load = _center_instances(db)[0].load
        return load.requests_ok > before and load.ready and load.capacity == 8

    wait_until(beat_carried_it, 10, "a heartbeat with the new request count")


def test_replica_http_engine_and_scrapes_end_to_end(gateway: str) -> None:
    from central.commands import Endpoint
    from central.engines import http_engine
    from central.scrape import ReplicaProbe
    from servekit.engine.protocol import Finish, GenerationRequest, Message, SamplingParams

    replica = next(iter(gateway_replicas(gateway).values()))
    url = replica["url"]
    assert " -m edge_agent serve --config " in replica["command"]
    assert replica["log"].endswith(".log")

    async def run() -> None:
        async with httpx.AsyncClient() as client:
            probe = ReplicaProbe(client)
            report = await probe.load(Endpoint(url, MODEL, 1, "load"))
            assert report is not None
            assert report.report is not None
            assert report.report.ready
            # The stand-in exports vLLM's gauge names too: the vLLM scraper reads it.
            gauges = await probe.load(Endpoint(url, MODEL, 1, "vllm"))
            assert gauges is not None
            assert gauges.running == report.running
        engine = http_engine(Endpoint(url, MODEL, 1, "load"))
        try:
            req = GenerationRequest(
                "e2e",
                SamplingParams(max_tokens=4, temperature=0.0),
                messages=(Message("user", "Say hi."),),
            )
            events = [e async for e in engine.generate(req)]
        finally:
            await engine.aclose()
        finish = events[-1]
        assert isinstance(finish, Finish)
        assert 0 < finish.completion_tokens <= 4

    anyio.run(run)


def test_killed_replica_is_removed_restarted_and_no_request_is_lost(gateway: str) -> None:
    victim = "cpu-a"
    before = gateway_replicas(gateway)[victim]
    os.kill(before["pid"], signal.SIGKILL)
    states: set[str] = set()
    codes: list[int] = []
    deadline = time.monotonic() + 90
    i = 0
    # Keep asking (two at a time) for as long as the replica is away.
    while time.monotonic() < deadline:
        now = gateway_replicas(gateway)[victim]
        states.add(now["state"])
        if now["restarts"] >= 1 and now["state"] == "healthy":
            break
        pair = [threading.Thread(target=lambda q=f"Q{i}-{k}": codes.append(
            _chat(gateway, q).status_code)) for k in range(2)]  # fmt: skip
        for t in pair:
            t.start()
        for t in pair:
            t.join(60)
        i += 1
    after = gateway_replicas(gateway)[victim]
    assert after["state"] == "healthy"
    assert after["restarts"] == 1
    assert after["pid"] != before["pid"]
    assert after["last_exit"] == -signal.SIGKILL
    assert states & {"restarting", "starting", "unhealthy"}
    assert codes
    assert set(codes) == {200}
    assert _chat(gateway, "Still there?").status_code == 200


def test_in_process_replica_beside_a_url_replica(model_path: Path, tmp_path: Path) -> None:
    from central.app import create_app
    from central.settings import CentralSettings
    from hybrid_llm.local.engine_double import create_double
    from hybrid_llm.local.servers import UvicornThread, wait_ready

    with UvicornThread(create_double(MODEL)) as double:
        local_spec = {
            "name": "local",
            "kind": "llamacpp",
            "mode": "inprocess",
            "model_path": str(model_path),
            "n_ctx": 512,
            "n_threads": 1,
        }
        remote_spec = {"name": "remote", "kind": "url", "url": double.url, "load_source": "vllm"}
        supervision = {"health_interval_s": 0.1, "scrape_interval_s": 0.1, "log_dir": tmp_path}
        settings = CentralSettings.model_validate(
            {"model": MODEL, "replicas": [local_spec, remote_spec], "supervision": supervision}
        )
        with UvicornThread(create_app(settings)) as gw:
            wait_ready(gw.url, timeout=60)
            wait_until(lambda: all_replicas_healthy(gw.url), 60, "both replicas healthy")
            local = gateway_replicas(gw.url)["local"]
            assert local["pid"] is None
            assert local["url"] == "inprocess://local"
            # Two at once: one lands on each replica (both have room for one).
            texts: list[str] = []
            barrier = threading.Barrier(2)

            def one(q: str) -> None:
                barrier.wait()
                texts.append(_chat(gw.url, q).json()["choices"][0]["message"]["content"])

            threads = [threading.Thread(target=one, args=(q,)) for q in ("A?", "B?")]
            for t in threads:
                t.start()
            for t in threads:
                t.join(60)
            served = {n: r["served"] for n, r in gateway_replicas(gw.url).items()}
    assert served == {"local": 1, "remote": 1}
    assert "Hello from the double" in texts
    assert len(texts) == 2
