"""The edge agent on a real socket (uvicorn): SSE, the openai SDK, disconnects, backpressure."""

from __future__ import annotations

import json
import socket
import time
from collections.abc import Iterator
from typing import Any

import httpx
import openai
import pytest

from edge_agent.app import create_app
from hybrid_llm.local.servers import UvicornThread

pytestmark = pytest.mark.model

MODEL = "smollm2-135m-instruct"
LONG = [{"role": "user", "content": "Write a very long story about a dragon and a knight."}]
# Greedy decoding keeps counting until max_tokens: a request that runs as long as we like.
COUNTING = {"model": MODEL, "prompt": "1, 2, 3, 4, 5, 6, 7, 8,", "temperature": 0, "stream": True}


@pytest.fixture(scope="module")
def agent(model_path: Any) -> Iterator[UvicornThread]:
    from edge_agent.settings import EdgeSettings

    settings = EdgeSettings.model_validate(
        {
            "instance": {"id": "edge-sock", "region": "test", "version": "v1"},
            "engine": {
                "model_path": str(model_path),
                "model_name": MODEL,
                "n_ctx": 1024,
                "n_threads": 2,
                "warmup_tokens": 1,
            },
            "admission": {"max_waiting": 1},
        }
    )
    with UvicornThread(create_app(settings)) as server:
        wait_ready(server.url)
        yield server


def wait_ready(url: str, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if httpx.get(url + "/ready").status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.05)
    raise TimeoutError(url)


def load(agent: UvicornThread) -> dict[str, Any]:
    data: dict[str, Any] = httpx.get(agent.url + "/load", timeout=30).json()
    return data


def wait_idle(agent: UvicornThread, timeout: float = 10) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    while True:
        report = load(agent)
        if report["running"] == 0 and report["waiting"] == 0:
            return report
        if time.monotonic() > deadline:
            raise AssertionError(f"engine still busy: {report}")
        time.sleep(0.02)


def test_openai_sdk_stream_equals_non_stream_with_usage(agent: UvicornThread) -> None:
    client = openai.OpenAI(base_url=agent.url + "/v1", api_key="unused", max_retries=0, timeout=60)
    messages: Any = [{"role": "user", "content": "What is the capital of France?"}]
    whole = client.chat.completions.create(
        model=MODEL, messages=messages, max_tokens=16, temperature=0
    )
    chunks = list(
        client.chat.completions.create(
            model=MODEL,
            messages=messages,
            max_tokens=16,
            temperature=0,
            stream=True,
            stream_options={"include_usage": True},
        )
    )
    streamed = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert streamed == whole.choices[0].message.content
    assert streamed
    final = chunks[-1]
    assert final.choices == []
    assert final.usage is not None
    assert whole.usage is not None
    assert final.usage.completion_tokens == whole.usage.completion_tokens
    assert final.usage.prompt_tokens == whole.usage.prompt_tokens
    assert final.usage.total_tokens == final.usage.prompt_tokens + final.usage.completion_tokens
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == whole.choices[
        0
    ].finish_reason
    completion = client.completions.create(
        model="edge", prompt="The sky is", max_tokens=4, temperature=0
    )
    assert completion.choices[0].text


def test_sse_framing_on_the_wire(agent: UvicornThread) -> None:
    raw = b""
    with httpx.stream(
        "POST", agent.url + "/v1/completions", timeout=60,
        json={"model": MODEL, "prompt": "One, two,", "max_tokens": 5, "stream": True},
    ) as resp:  # fmt: skip
        assert resp.status_code == 200
        assert resp.headers["content-type"].startswith("text/event-stream")
        for chunk in resp.iter_raw():
            raw += chunk
    frames = raw.split(b"\n\n")
    assert frames[-1] == b""
    assert frames[-2] == b"data: [DONE]"
    payloads = [json.loads(f[len(b"data: ") :]) for f in frames[:-2]]
    assert all(f.startswith(b"data: ") for f in frames[:-1])
    assert all(p["object"] == "text_completion" for p in payloads)
    assert payloads[-1]["choices"][0]["finish_reason"] in ("stop", "length")
    assert len({p["id"] for p in payloads}) == 1


def test_client_disconnect_mid_stream_frees_the_engine(agent: UvicornThread) -> None:
    body = {**COUNTING, "max_tokens": 600}
    with (
        httpx.Client(timeout=60) as client,
        client.stream("POST", agent.url + "/v1/completions", json=body) as resp,
    ):
        lines = resp.iter_lines()
        for _ in range(6):
            next(lines)
        assert load(agent)["running"] == 1
    # The connection is closed; the engine must stop long before 800 tokens.
    wait_idle(agent, timeout=5)
    metrics = httpx.get(agent.url + "/metrics").text
    assert 'outcome="cancelled"' in metrics


def test_disconnect_while_queued_leaves_the_queue(agent: UvicornThread) -> None:
    body = {**COUNTING, "max_tokens": 600}
    with (
        httpx.Client(timeout=60) as client,
        client.stream("POST", agent.url + "/v1/completions", json=body) as running,
    ):
        running_lines = running.iter_lines()  # keep a reference: dropping it closes the stream
        next(running_lines)
        # A raw socket request that we abandon while it waits for a slot.
        with send_raw(agent.port, "/v1/completions", {**body, "max_tokens": 5}):
            deadline = time.monotonic() + 5
            while load(agent)["waiting"] != 1:
                assert time.monotonic() < deadline, f"request never queued: {load(agent)}"
                time.sleep(0.01)
        deadline = time.monotonic() + 5
        while load(agent)["waiting"] != 0:
            assert time.monotonic() < deadline, "abandoned request stayed queued"
            time.sleep(0.01)
        assert load(agent)["running"] == 1
    wait_idle(agent)


def send_raw(port: int, path: str, body: dict[str, Any]) -> socket.socket:
    """Send a request without waiting for its response (it may sit in the queue)."""
    sock = socket.create_connection(("127.0.0.1", port))
    payload = json.dumps(body).encode()
    sock.sendall(
        f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(payload)}\r\n\r\n".encode()
        + payload
    )
    return sock


def test_queue_full_gets_429_with_retry_after_at_once(agent: UvicornThread) -> None:
    body = {**COUNTING, "max_tokens": 600}
    with (
        httpx.Client(timeout=60) as c1,
        c1.stream("POST", agent.url + "/v1/completions", json=body) as first,
    ):
        first_lines = first.iter_lines()  # keep a reference: dropping it closes the stream
        next(first_lines)
        with send_raw(agent.port, "/v1/completions", body):
            deadline = time.monotonic() + 10
            while load(agent)["waiting"] != 1:
                assert time.monotonic() < deadline, load(agent)
                time.sleep(0.01)
            started = time.monotonic()
            refused = httpx.post(
                agent.url + "/v1/completions", json={**body, "stream": False}, timeout=60
            )
            elapsed = time.monotonic() - started
            assert refused.status_code == 429
            assert int(refused.headers["retry-after"]) >= 1
            assert refused.json()["error"]["code"] == "queue_full"
            assert elapsed < 2.0
            sdk = openai.OpenAI(base_url=agent.url + "/v1", api_key="unused", max_retries=0)
            with pytest.raises(openai.RateLimitError):
                sdk.chat.completions.create(model=MODEL, messages=LONG, max_tokens=2)  # type: ignore[arg-type]
    wait_idle(agent)


def test_ready_is_503_while_warming_up(model_path: Any) -> None:
    from edge_agent.settings import EdgeSettings

    settings = EdgeSettings.model_validate(
        {
            "engine": {
                "model_path": str(model_path),
                "model_name": MODEL,
                "n_ctx": 512,
                "n_threads": 2,
                "warmup_tokens": 120,
            },
        }
    )
    seen: list[int] = []
    with UvicornThread(create_app(settings)) as server:
        first = httpx.get(server.url + "/ready")
        seen.append(first.status_code)
        early = httpx.post(server.url + "/v1/chat/completions", timeout=60,
                           json={"model": MODEL, "messages": LONG, "max_tokens": 1})  # fmt: skip
        wait_ready(server.url)
        seen.append(httpx.get(server.url + "/ready").status_code)
    assert seen == [503, 200]
    assert first.json()["error"]["code"] == "not_ready"
    assert "retry-after" in first.headers
    assert early.status_code == 503
