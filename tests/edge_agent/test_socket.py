"""The edge agent on a real socket (uvicorn) over a scripted engine: SSE on the
wire, the openai SDK, disconnects, backpressure."""

from __future__ import annotations

import contextlib
import json
import socket
import time
from collections.abc import Iterator
from typing import Any

import httpx
import openai
import pytest

from hybrid_llm.local.servers import UvicornThread, wait_ready, wait_until
from servekit.connection_guard import guarded_protocol
from tests.edge_agent.conftest import (
    MODEL,
    ScriptedEngines,
    scripted_app,
    sdk_chat_whole_and_streamed,
    settings_from,
)

LONG = [{"role": "user", "content": "Write a very long story about a dragon and a knight."}]
# The scripted engine counts until max_tokens, 10 ms a token: a request that runs as long as
# we like.
COUNTING = {"model": MODEL, "prompt": "COUNT", "temperature": 0, "stream": True}


@pytest.fixture(scope="module")
def engines() -> ScriptedEngines:
    return ScriptedEngines()


@pytest.fixture(scope="module")
def agent(
    engines: ScriptedEngines, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[UvicornThread]:
    stand_in = tmp_path_factory.mktemp("edge-sock") / "stand-in.gguf"
    stand_in.write_bytes(b"GGUF scripted")
    settings = settings_from(stand_in, instance__id="edge-sock", admission__max_waiting=1)
    with UvicornThread(scripted_app(settings, engines)) as server:
        wait_ready(server.url, timeout=30)
        yield server


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


def test_openai_sdk_stream_carries_the_whole_answer_and_usage(agent: UvicornThread) -> None:
    assert sdk_chat_whole_and_streamed(agent.url) == "Hello from the double"
    client = openai.OpenAI(base_url=agent.url + "/v1", api_key="unused", max_retries=0)
    completion = client.completions.create(
        model="edge", prompt="The sky is", max_tokens=4, temperature=0
    )
    assert completion.choices[0].text == "Hello from the double"


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


def test_client_disconnect_mid_stream_frees_the_engine(
    agent: UvicornThread, engines: ScriptedEngines
) -> None:
    body = {**COUNTING, "max_tokens": 600}
    with (
        httpx.Client(timeout=60) as client,
        client.stream("POST", agent.url + "/v1/completions", json=body) as resp,
    ):
        lines = resp.iter_lines()
        for _ in range(6):
            next(lines)
        assert load(agent)["running"] == 1
    # The connection is closed; the engine must stop long before 600 tokens (6 s).
    wait_idle(agent, timeout=3)
    assert engines.current.running == 0  # its stream was closed, not just the slot freed
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


@contextlib.contextmanager
def unread_stream(port: int) -> Iterator[socket.socket]:
    """A 60,000-token completion whose client, on a small receive buffer, reads
    the response's first bytes and then nothing more, the socket held open."""
    payload = json.dumps({**COUNTING, "max_tokens": 60_000}).encode()
    with socket.socket() as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        sock.connect(("127.0.0.1", port))
        sock.sendall(
            b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json"
            + f"\r\nContent-Length: {len(payload)}\r\n\r\n".encode()
            + payload
        )
        assert sock.recv(1024).startswith(b"HTTP/1.1 200")
        yield sock


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


def test_a_client_that_stops_reading_frees_the_slot_within_the_stall_time(
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    """Its stream held the engine's only slot for as long as the socket stayed open."""
    engines = ScriptedEngines(pace_s=0.0002)  # output far beyond what the sockets hold
    stand_in = tmp_path_factory.mktemp("edge-stall") / "stand-in.gguf"
    stand_in.write_bytes(b"GGUF scripted")
    settings = settings_from(
        stand_in, instance__id="edge-stall", engine__n_ctx=65536, server__send_stall_s=0.5
    )
    protocol = guarded_protocol(settings.server.connection_limits())
    with UvicornThread(scripted_app(settings, engines), http=protocol) as agent:
        wait_ready(agent.url, timeout=30)
        with unread_stream(agent.port):
            assert load(agent)["running"] == 1
            # ... and it reads nothing more, the socket held open.
            wait_until(lambda: load(agent)["running"] == 0, 10, "the slot to come back")
            assert engines.current.running == 0  # the engine stopped generating for it
            assert len(engines.current.requests) == 1


def test_a_stream_past_its_deadline_ends_with_an_error_and_frees_the_slot(
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    """A client reading every byte of a long generation held the slot until it was done."""
    engines = ScriptedEngines()  # 10 ms a token: 1000 tokens take 10 s
    stand_in = tmp_path_factory.mktemp("edge-deadline") / "stand-in.gguf"
    stand_in.write_bytes(b"GGUF scripted")
    settings = settings_from(stand_in, instance__id="edge-deadline", server__stream_deadline_s=0.5)
    with UvicornThread(scripted_app(settings, engines)) as agent:
        wait_ready(agent.url, timeout=30)
        began = time.monotonic()
        body = {**COUNTING, "max_tokens": 1000}
        r = httpx.post(agent.url + "/v1/completions", json=body, timeout=30)
        took = time.monotonic() - began
        frames = [f for f in r.text.split("\n\n") if f]
        assert r.status_code == 200
        assert frames[-1] == "data: [DONE]"
        error = json.loads(frames[-2].removeprefix("data: "))["error"]
        assert error["code"] == "stream_deadline_exceeded", frames[-2]
        assert len(frames) > 3  # tokens came before it
        assert took < 3
        wait_idle(agent, timeout=3)
        assert engines.current.running == 0  # the engine stopped generating for it
        metrics = httpx.get(agent.url + "/metrics").text
        outcomes = [line for line in metrics.splitlines() if line.startswith("hybrid_requests_t")]
        assert len(outcomes) == 1, outcomes  # counted once, not as an error
        assert 'outcome="deadline"' in outcomes[0]
        assert outcomes[0].endswith(" 1.0")
        # The slot came back once: a short answer is served at once.
        short = {**COUNTING, "max_tokens": 3, "stream": False}
        assert httpx.post(agent.url + "/v1/completions", json=short, timeout=30).is_success


def _guard_counts(url: str) -> dict[str, float]:
    metrics = httpx.get(url + "/metrics", timeout=10).text
    prefix = 'hybrid_connections_closed_total{reason="'
    return {
        line.removeprefix(prefix).split('"')[0]: float(line.rsplit(" ", 1)[1])
        for line in metrics.splitlines()
        if line.startswith(prefix)
    }


def _closed(sock: socket.socket) -> bytes:
    sock.settimeout(5)
    data = b""
    while part := sock.recv(65536):
        data += part
    return data


def test_metrics_count_what_the_connection_guards_closed(
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    engines = ScriptedEngines(pace_s=0.0002)  # output far beyond what the sockets hold
    stand_in = tmp_path_factory.mktemp("edge-guards") / "stand-in.gguf"
    stand_in.write_bytes(b"GGUF scripted")
    settings = settings_from(
        stand_in,
        instance__id="edge-guards",
        engine__n_ctx=65536,
        server__send_stall_s=0.5,
        server__header_timeout_s=0.5,
        server__max_header_bytes=16384,
        server__max_connections=2,
    )
    app = scripted_app(settings, engines)
    guard = app.state.connection_guard  # as `edge-agent serve` hands it to the protocol
    protocol = guarded_protocol(settings.server.connection_limits(), guard.closed)
    with UvicornThread(app, http=protocol) as agent:
        wait_ready(agent.url, timeout=30)
        assert set(_guard_counts(agent.url).values()) == {0.0}  # every reason, at 0
        with socket.create_connection(("127.0.0.1", agent.port)) as sock:
            sock.sendall(b"GET /health HTTP/1.1\r\nhost: t\r\n")  # never the blank line
            assert _closed(sock).startswith(b"HTTP/1.1 408")
        with socket.create_connection(("127.0.0.1", agent.port)) as sock:
            sock.sendall(b"GET /health HTTP/1.1\r\nhost: t\r\nx-big: " + b"a" * 20_000)
            assert _closed(sock).startswith(b"HTTP/1.1 431")
        held = [socket.create_connection(("127.0.0.1", agent.port)) for _ in range(2)]
        try:
            for sock in held:
                sock.sendall(b"GET /health HTTP/1.1\r\nhost: t\r\n\r\n")
                assert sock.recv(1024).startswith(b"HTTP/1.1 200")
            with socket.create_connection(("127.0.0.1", agent.port)) as extra:
                extra.sendall(b"GET /health HTTP/1.1\r\nhost: t\r\n\r\n")
                assert _closed(extra).startswith(b"HTTP/1.1 503")
        finally:
            for sock in held:
                sock.close()
        time.sleep(0.2)  # the server notices the two closed
        with unread_stream(agent.port):
            wait_until(lambda: _guard_counts(agent.url)["send_stall"] == 1, 10, "a stall")
        assert _guard_counts(agent.url) == {
            "send_stall": 1,
            "header_timeout": 1,
            "header_too_large": 1,
            "too_many_connections": 1,
        }
