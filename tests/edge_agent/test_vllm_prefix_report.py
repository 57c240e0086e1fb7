"""The edge agent on a real vLLM reports what vLLM's prefix cache holds: the names of a
long prompt appear in ``/load`` within about a second of its answer (from vLLM's
KV-cache events), and go when vLLM's cache is reset or the server restarts."""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from hybrid_llm.local.servers import free_port, service_process
from servekit.prefix_blocks import chained_names, conversation_text, leading_run, scope_seed
from tests.support.vllm import MODEL_NAME, require_vllm, vllm_engine, write_edge_config

pytestmark = [pytest.mark.vllm, pytest.mark.slow]

SYSTEM = "You answer questions about the Harbour Street library. " + " ".join(
    f"Rule {i}: name the shelf of every book you mention." for i in range(40)
)  # about 2,200 characters, 500 tokens


@pytest.fixture(scope="module")
def edge(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    require_vllm()
    tmp = tmp_path_factory.mktemp("edge-vllm-prefixes")
    port = free_port()
    engine = vllm_engine(
        tmp,
        # /reset_prefix_cache is one of vLLM's development endpoints.
        env={"VLLM_SERVER_DEV_MODE": "1"},
        process={"startup_timeout_s": 400, "restart_backoff_initial_s": 0.5},
    )
    config = write_edge_config(tmp / "edge.yaml", port, engine)
    url = f"http://127.0.0.1:{port}"
    with service_process(["edge_agent", "serve", "--config", str(config)], url, ready_timeout=420):
        yield url


def messages(question: str) -> list[dict[str, str]]:
    return [{"role": "system", "content": SYSTEM}, {"role": "user", "content": question}]


def ask(edge: str, question: str, salt: str | None = None) -> None:
    body: dict[str, Any] = {"model": MODEL_NAME, "max_tokens": 2, "temperature": 0,
                            "messages": messages(question)}  # fmt: skip
    if salt is not None:
        body["cache_salt"] = salt
    response = httpx.post(edge + "/v1/chat/completions", json=body, timeout=120)
    assert response.status_code == 200, response.text


def held_run(edge: str, question: str, salt: str | None = None) -> tuple[int, int]:
    """How many of the conversation's leading block names (as a router names them)
    the agent's /load reports held, and how many it has."""
    load = httpx.get(edge + "/load").json()
    assert load["prefix_block_chars"] == 64
    text = conversation_text((m["role"], m["content"]) for m in messages(question))
    names = chained_names(text, 64, scope_seed(salt))
    return leading_run(names, set(load["prefix_blocks"])), len(names)


def until(check: Any, within_s: float, missed: str) -> float:
    """Seconds until ``check()`` holds (polled every 50 ms), else fail with ``missed``."""
    start = time.monotonic()
    while not check():
        assert time.monotonic() - start < within_s, missed
        time.sleep(0.05)
    return time.monotonic() - start


def test_a_long_prompt_is_reported_held_and_a_reset_takes_it_away(edge: str) -> None:
    question = "Where are the atlases?"
    assert held_run(edge, question)[0] == 0
    ask(edge, question)
    until(lambda: held_run(edge, question)[0] > 0, 1.0, "not reported within a second")
    run, total = held_run(edge, question)
    assert run >= total * 0.8  # all but the unfinished last KV block and the question
    # Another scope's names for the same text are not in the report.
    assert held_run(edge, question, salt="s" * 64)[0] == 0
    # A second question reuses the system prompt: its shared blocks count for both.
    ask(edge, "Where are the maps?")
    until(lambda: held_run(edge, "Where are the maps?")[0] >= total * 0.8, 1.0, "second prompt")
    # vLLM resets its prefix cache (AllBlocksCleared): nothing is held any more.
    url = httpx.get(edge + "/engine").json()["url"]
    assert httpx.post(url + "/reset_prefix_cache").json() == {"success": True}
    # vLLM publishes a step's events after the step: the reset goes out with the next one.
    ask_short = {"model": MODEL_NAME, "prompt": "Hello", "max_tokens": 1}
    assert httpx.post(edge + "/v1/completions", json=ask_short, timeout=60).status_code == 200
    until(lambda: held_run(edge, question)[0] == 0, 1.0, "still reported after a reset")
    assert httpx.get(edge + "/load").json()["prefix_blocks"] == []


def test_a_restarted_engine_holds_nothing_and_reports_again(edge: str) -> None:
    question = "Is there a reading room?"
    ask(edge, question)
    until(lambda: held_run(edge, question)[0] > 0, 1.0, "not reported within a second")
    before = httpx.get(edge + "/engine").json()
    os.killpg(before["pid"], signal.SIGKILL)
    until(lambda: held_run(edge, question)[0] == 0, 5.0, "still credited after the engine died")
    until(lambda: httpx.get(edge + "/ready").status_code == 200, 400, "not restarted")
    assert held_run(edge, question)[0] == 0  # the new server starts cold
    ask(edge, question)  # the feed reconnected to the new server's socket
    until(lambda: held_run(edge, question)[0] > 0, 1.0, "not reported after the restart")
    assert httpx.get(edge + "/engine").json()["kv_event_gaps"] >= 1  # its sequence restarted
