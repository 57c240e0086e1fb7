"""The edge agent on a real vLLM: one `edge-agent serve` process that launches
`vllm serve` (CPU build) on the converted SmolLM2, checked with the `openai` SDK."""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import openai
import pytest

from hybrid_llm.local.servers import free_port, service_process
from servekit.engine.vllm_args import VLLM_API_KEY_ENV
from tests.support.vllm import MODEL_NAME, require_vllm, vllm_engine, write_edge_config

pytestmark = [pytest.mark.vllm, pytest.mark.slow]


@pytest.fixture(scope="module")
def edge(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    require_vllm()
    tmp = tmp_path_factory.mktemp("edge-vllm")
    port = free_port()
    engine = vllm_engine(tmp, process={"startup_timeout_s": 400, "restart_backoff_initial_s": 0.5})
    config = write_edge_config(tmp / "edge.yaml", port, engine)
    url = f"http://127.0.0.1:{port}"
    with service_process(["edge_agent", "serve", "--config", str(config)], url, ready_timeout=420):
        yield url


@pytest.fixture
def client(edge: str) -> Iterator[openai.OpenAI]:
    with openai.OpenAI(base_url=edge + "/v1", api_key="unused", max_retries=0) as sdk:
        yield sdk


def test_chat_non_streaming_with_usage(client: openai.OpenAI) -> None:
    done = client.chat.completions.create(
        model=MODEL_NAME,
        messages=[{"role": "user", "content": "Name three rivers in China."}],
        max_tokens=12,
        temperature=0,
    )
    choice = done.choices[0]
    assert choice.message.role == "assistant"
    assert choice.message.content
    assert choice.finish_reason == "length"
    assert done.model == MODEL_NAME
    assert done.usage is not None
    assert done.usage.completion_tokens == 12
    # SmolLM2's chat template adds a system turn: the prompt is longer than the question.
    assert done.usage.prompt_tokens > 10


def test_chat_streaming_ends_with_usage(client: openai.OpenAI) -> None:
    stream = client.chat.completions.create(
        model="edge",
        messages=[{"role": "user", "content": "Count from one to five."}],
        max_tokens=16,
        temperature=0,
        stream=True,
        stream_options={"include_usage": True},
    )
    chunks = list(stream)
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text
    finishes = [c.choices[0].finish_reason for c in chunks if c.choices]
    assert finishes[-1] in ("stop", "length")
    usage = chunks[-1].usage
    assert usage is not None
    assert 0 < usage.completion_tokens <= 16


def test_greedy_answers_match_vllm_itself(client: openai.OpenAI, edge: str) -> None:
    """The agent passes text through unchanged: same tokens as asking vLLM directly."""
    engine_url = _engine_url(edge)
    body = {"model": MODEL_NAME, "prompt": "The capital of France is", "max_tokens": 8}
    key = {"Authorization": f"Bearer {_engine_key(edge)}"}  # as the agent asks it
    direct = httpx.post(
        engine_url + "/v1/completions", json={**body, "temperature": 0}, headers=key
    ).json()
    via = client.completions.create(
        model=MODEL_NAME, prompt="The capital of France is", max_tokens=8, temperature=0
    )
    assert via.choices[0].text == direct["choices"][0]["text"]
    streamed = client.completions.create(
        model=MODEL_NAME,
        prompt="The capital of France is",
        max_tokens=8,
        temperature=0,
        stream=True,
    )
    assert "".join(c.choices[0].text for c in streamed if c.choices) == via.choices[0].text


def test_repeated_prefix_reports_cached_tokens(client: openai.OpenAI) -> None:
    """--enable-prompt-tokens-details: vLLM's prefix-cache hits reach usage."""
    system = "You are a careful assistant. " + " ".join(f"Rule {i}: be brief." for i in range(80))
    cached = []
    for question in ("What is two plus two?", "What is three plus three?"):
        done = client.chat.completions.create(
            model=MODEL_NAME,
            messages=[
                {"role": "system", "content": system},
                {"role": "user", "content": question},
            ],
            max_tokens=2,
            temperature=0,
        )
        assert done.usage is not None
        details = done.usage.prompt_tokens_details
        cached.append(details.cached_tokens if details and details.cached_tokens else 0)
    assert cached[1] >= 128  # at least one full KV block of the shared system prompt


def test_cache_salt_scopes_vllms_prefix_cache(edge: str) -> None:
    """The router's per-tenant cache_salt reaches vLLM: another salt gets no hit."""
    system = "You are a terse assistant. " + " ".join(f"Rule {i}: cite sources." for i in range(80))

    def cached(salt: str, question: str) -> int:
        body = {"model": MODEL_NAME, "max_tokens": 2, "temperature": 0, "cache_salt": salt,
                "messages": [{"role": "system", "content": system},
                             {"role": "user", "content": question}]}  # fmt: skip
        r = httpx.post(edge + "/v1/chat/completions", json=body, timeout=120)
        assert r.status_code == 200, r.text
        return int((r.json()["usage"].get("prompt_tokens_details") or {}).get("cached_tokens", 0))

    cached("a" * 64, "What is two plus two?")
    assert cached("a" * 64, "What is three plus three?") >= 128  # its own scope hits
    assert cached("e" * 64, "What is three plus three?") == 0  # the same text, another salt


def test_errors_in_the_openai_shape(client: openai.OpenAI, edge: str) -> None:
    with pytest.raises(openai.NotFoundError) as missing:
        client.chat.completions.create(
            model="no-such-model", messages=[{"role": "user", "content": "hi"}]
        )
    assert missing.value.code == "model_not_found"
    with pytest.raises(openai.BadRequestError) as too_long:
        client.chat.completions.create(
            model=MODEL_NAME, messages=[{"role": "user", "content": "hi"}], max_tokens=5000
        )
    assert too_long.value.code == "context_length_exceeded"
    # A prompt longer than vLLM's max_model_len: vLLM refuses, the agent keeps it a 400.
    huge = "word " * 3000
    with pytest.raises(openai.BadRequestError) as overflow:
        client.completions.create(model=MODEL_NAME, prompt=huge, max_tokens=4)
    assert "2048" in str(overflow.value)
    bad = httpx.post(edge + "/v1/chat/completions", json={"model": MODEL_NAME})
    assert bad.status_code == 400
    assert set(bad.json()["error"]) == {"message", "type", "param", "code"}


def test_vllm_answers_only_its_agent_but_probes_stay_open(edge: str) -> None:
    """The server's per-launch key: /v1 without it is 401 from vLLM itself, while the
    agent (which sends it) serves and reads /health and /metrics; the key is not shown."""
    engine = httpx.get(edge + "/engine").json()
    assert httpx.get(engine["url"] + "/v1/models").status_code == 401
    wrong = {"Authorization": "Bearer guessed"}
    assert httpx.get(engine["url"] + "/v1/models", headers=wrong).status_code == 401
    assert httpx.get(engine["url"] + "/health").status_code == 200
    assert httpx.get(engine["url"] + "/metrics").status_code == 200
    assert "VLLM_API_KEY='***'" in engine["command"]
    assert httpx.get(edge + "/load").json()["max_context_tokens"] == 2048  # via /v1/models


def test_load_and_metrics_come_from_vllm(edge: str, client: openai.OpenAI) -> None:
    client.completions.create(model=MODEL_NAME, prompt="Hello", max_tokens=4)
    load = httpx.get(edge + "/load").json()
    assert load["ready"] is True
    assert load["capacity"] == 8
    assert load["max_context_tokens"] == 2048  # vLLM's max_model_len, from /v1/models
    assert load["decode_tokens_per_s"] > 0
    assert load["prefix_cache_query_tokens"] > 0  # vLLM's own counter
    metrics = httpx.get(edge + "/metrics").text
    assert 'vllm:num_requests_running{model="smollm2-135m-instruct"' in metrics
    assert 'tier="edge"' in metrics


def _ready_throughout(edge: str, seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if httpx.get(edge + "/ready").status_code != 200:
            return False
        time.sleep(0.2)
    return True


def test_a_stalled_engine_is_down_only_after_checks_in_a_row_fail(
    edge: str, client: openai.OpenAI
) -> None:
    """SIGSTOP the vLLM server: one check timing out (a second server starting on the
    same cores does that) keeps the engine ready; a stall through several checks does not."""
    pid = int(httpx.get(edge + "/engine").json()["pid"])
    os.killpg(pid, signal.SIGSTOP)
    try:
        # Each check waits 2 s for /metrics and 2 s for /health: 5 s fails one at most.
        assert _ready_throughout(edge, 5.0), "one slow check took the engine out"
        assert not _ready_throughout(edge, 25.0), "a stalled engine stayed ready"
    finally:
        os.killpg(pid, signal.SIGCONT)
    _serves_again(edge, client, 30, "the engine did not come back after the stall")
    assert int(httpx.get(edge + "/engine").json()["pid"]) == pid  # not restarted


def test_a_killed_engine_is_restarted_and_serves_again(edge: str, client: openai.OpenAI) -> None:
    """SIGKILL the vLLM server: /ready turns 503, the agent restarts it, answers resume."""
    before = httpx.get(edge + "/engine").json()
    assert before["kind"] == "vllm"
    assert "--enforce-eager" in before["command"]
    os.killpg(before["pid"], signal.SIGKILL)
    deadline = time.monotonic() + 10
    while httpx.get(edge + "/ready").status_code == 200:
        assert time.monotonic() < deadline, "the agent did not notice its engine died"
        time.sleep(0.1)
    _serves_again(edge, client, 400, "the engine was not restarted")
    after = httpx.get(edge + "/engine").json()
    assert after["restarts"] == before["restarts"] + 1
    assert after["pid"] != before["pid"]


def _serves_again(edge: str, client: openai.OpenAI, within_s: float, missed: str) -> None:
    """Ready again within ``within_s`` (else ``missed``), and answering."""
    deadline = time.monotonic() + within_s
    while httpx.get(edge + "/ready").status_code != 200:
        assert time.monotonic() < deadline, missed
        time.sleep(0.2)
    done = client.completions.create(model=MODEL_NAME, prompt="Hello", max_tokens=4)
    assert done.usage is not None
    assert done.usage.completion_tokens == 4


def _engine_url(edge: str) -> str:
    return str(httpx.get(edge + "/engine").json()["url"])


def _engine_key(edge: str) -> str:
    """The per-launch key the agent gave its vLLM, read where an operator on the host
    could read it: the server process's environment."""
    environ = Path(f"/proc/{_engine_pid(edge)}/environ").read_bytes().split(b"\0")
    name = VLLM_API_KEY_ENV.encode() + b"="
    return next(v[len(name) :] for v in environ if v.startswith(name)).decode()


def _engine_pid(edge: str) -> int:
    return int(httpx.get(edge + "/engine").json()["pid"])
