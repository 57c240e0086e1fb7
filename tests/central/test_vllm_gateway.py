"""The central gateway over two real `vllm serve` replicas (CPU build), launched
from the command lines it generates (configs/central-vllm-cpu.yaml).

One gateway serves the module: OpenAI conformance through it, balancing across
the replicas, their real vLLM metrics, and recovery when one is SIGKILLed (last).
"""

from __future__ import annotations

import os
import signal
import threading
import time
from collections.abc import Iterator

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
from servekit.prefix_blocks import chained_names, conversation_text, leading_run
from tests.support.vllm import HF_MODEL, MODEL_NAME, VLLM, require_vllm, sdk_stream

pytestmark = [pytest.mark.vllm, pytest.mark.slow]


@pytest.fixture(scope="module")
def gateway(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    require_vllm()
    config = yaml.safe_load((REPO / "configs" / "central-vllm-cpu.yaml").read_text())
    run = tmp_path_factory.mktemp("central-vllm")
    config["supervision"]["log_dir"] = str(run / "logs")
    config.pop("registry")
    for replica in config["replicas"]:
        replica["executable"] = str(VLLM)
        replica["model"] = str(HF_MODEL)
        replica["cache_dir"] = str(run / "vllm-cache")
    path = run / "central-vllm-cpu.yaml"
    path.write_text(yaml.safe_dump(config))
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    args = ["central", "serve", "--config", str(path), "--port", str(port)]
    with service_process(args, url, ready_timeout=450):
        wait_until(lambda: all_replicas_healthy(url), 450, "both vLLM replicas healthy")
        yield url


def test_replicas_run_the_generated_vllm_command_lines(gateway: str) -> None:
    replicas = gateway_replicas(gateway)
    assert set(replicas) == {"vllm-a", "vllm-b"}
    for name, core in (("vllm-a", "0"), ("vllm-b", "1")):
        command = replicas[name]["command"]
        assert f"VLLM_CPU_OMP_THREADS_BIND={core} " in command
        assert "CUDA_VISIBLE_DEVICES" not in command
        assert f" serve {HF_MODEL} " in command
        assert "--enable-prompt-tokens-details" in command
        assert replicas[name]["capacity"] == 8
        # The replica answers vLLM's own API at the address the gateway derived.
        models = httpx.get(replicas[name]["url"] + "/v1/models").json()
        assert models["data"][0]["id"] == MODEL_NAME
        assert models["data"][0]["max_model_len"] == 8192


def test_openai_sdk_through_the_gateway(gateway: str) -> None:
    with openai.OpenAI(base_url=gateway + "/v1", api_key="unused", max_retries=0) as client:
        assert [m.id for m in client.models.list()] == [MODEL_NAME]
        chat = client.chat.completions.create(
            model=MODEL_NAME,
            messages=[{"role": "user", "content": "Say hello."}],
            max_tokens=8,
            temperature=0,
        )
        assert chat.choices[0].message.content
        assert chat.usage is not None
        assert chat.usage.completion_tokens == 8
        text, _ = sdk_stream(client, MODEL_NAME)
        assert text
        completion = client.completions.create(model=MODEL_NAME, prompt="The sky is", max_tokens=4)
        assert completion.choices[0].text
        with pytest.raises(openai.NotFoundError):
            client.chat.completions.create(
                model="nope", messages=[{"role": "user", "content": "x"}], max_tokens=2
            )
        # vLLM's own refusal (prompt past max_model_len) comes back as a 400, not a 5xx.
        with pytest.raises(openai.BadRequestError):
            client.completions.create(model=MODEL_NAME, prompt="word " * 9000, max_tokens=2)


def test_concurrent_load_uses_both_replicas_and_their_metrics(gateway: str) -> None:
    before = {n: r["served"] for n, r in gateway_replicas(gateway).items()}
    seen_running: list[int] = []
    stop = threading.Event()

    def watch() -> None:
        while not stop.is_set():
            for r in gateway_replicas(gateway).values():
                if r["engine_running"]:
                    seen_running.append(r["engine_running"])
            time.sleep(0.05)

    watcher = threading.Thread(target=watch)
    watcher.start()
    codes: list[int] = []
    # Long enough that the gateway's scrapes land inside it: on two shared cores a
    # replica's own /metrics answers in 0.1-2.2 s while it decodes (measured).
    questions = [f"Write a long story about the number {i}." for i in range(8)]
    barrier = threading.Barrier(len(questions))

    def one(question: str) -> None:
        barrier.wait()
        body = {"model": MODEL_NAME, "messages": [{"role": "user", "content": question}],
                "max_tokens": 128}  # fmt: skip
        codes.append(httpx.post(gateway + "/v1/chat/completions", json=body, timeout=120)
                     .status_code)  # fmt: skip

    threads = [threading.Thread(target=one, args=(q,)) for q in questions]
    for t in threads:
        t.start()
    for t in threads:
        t.join(180)
    stop.set()
    watcher.join()
    assert codes == [200] * len(questions)
    after = {n: r["served"] for n, r in gateway_replicas(gateway).items()}
    deltas = {n: after[n] - before[n] for n in after}
    assert sum(deltas.values()) == len(questions)
    assert min(deltas.values()) >= 2, deltas
    # vllm:num_requests_running, scraped from the replicas themselves, saw the work.
    assert seen_running
    assert max(seen_running) >= 2
    metrics = httpx.get(gateway + "/metrics").text
    kv = [x for x in metrics.splitlines() if x.startswith("central_replica_kv_cache_usage{")]
    assert len(kv) == 2  # vllm:kv_cache_usage_perc of each replica
    assert all('kind="vllm"' in line for line in kv)


def test_the_gateway_reports_what_its_replicas_prefix_caches_hold(gateway: str) -> None:
    """A long prompt's names (as a router names them) reach the gateway's /load within
    about a second, from the replica's vLLM KV-cache events; gone once it is killed."""
    system = "You answer questions about tides. " + " ".join(
        f"Rule {i}: give times in UTC." for i in range(60)
    )
    messages = [{"role": "system", "content": system}, {"role": "user", "content": "When?"}]
    names = chained_names(conversation_text((m["role"], m["content"]) for m in messages), 64)

    def held() -> int:
        load = httpx.get(gateway + "/load").json()
        return leading_run(names, set(load["prefix_blocks"] or ()))

    before = {n: r["served"] for n, r in gateway_replicas(gateway).items()}
    body = {"model": MODEL_NAME, "messages": messages, "max_tokens": 2, "temperature": 0}
    assert httpx.post(gateway + "/v1/chat/completions", json=body, timeout=120).status_code == 200
    wait_until(lambda: held() >= len(names) * 0.8, 1.0, "the prompt's names in /load")
    replicas = gateway_replicas(gateway)
    (home,) = [n for n, r in replicas.items() if r["served"] > before[n]]
    assert replicas[home]["kv_event_batches"] > 0
    os.killpg(replicas[home]["pid"], signal.SIGKILL)
    wait_until(lambda: held() == 0, 10, "names of a killed replica still in /load")
    wait_until(lambda: gateway_replicas(gateway)[home]["state"] == "healthy", 450, "back")
    assert held() == 0  # the new server starts cold


def test_a_killed_replica_is_bypassed_and_restarted(gateway: str) -> None:
    victim = gateway_replicas(gateway)["vllm-a"]
    os.killpg(victim["pid"], signal.SIGKILL)
    wait_until(
        lambda: gateway_replicas(gateway)["vllm-a"]["state"] != "healthy",
        10,
        "vllm-a out of rotation",
    )
    # Meanwhile every request is served by the other replica.
    for _ in range(3):
        body = {"model": MODEL_NAME, "prompt": "Hello", "max_tokens": 2}
        assert httpx.post(gateway + "/v1/completions", json=body, timeout=60).status_code == 200
    wait_until(
        lambda: gateway_replicas(gateway)["vllm-a"]["state"] == "healthy", 450, "vllm-a back"
    )
    again = gateway_replicas(gateway)["vllm-a"]
    assert again["restarts"] == victim["restarts"] + 1
    assert again["pid"] != victim["pid"]
    assert again["last_exit"] == -signal.SIGKILL
