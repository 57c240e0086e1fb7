"""Two real context windows: what the edge cannot hold goes to the center that can.

Two edge agents on the real model as subprocesses, one with a 256-token
window per slot (the edge tier), one with 1024 (registered as the center
tier); prompts are kept short enough for a loaded 2-core machine. The
router (in-process, real sockets) learns both windows from their ``/load``.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from geo_router.app import create_app
from hybrid_llm.local.servers import REPO, UvicornThread, free_port, service_process
from servekit.http_protocol import HeadWithBodyProtocol
from tests.geo_router.conftest import KEY, router_settings, upstream

pytestmark = [pytest.mark.model, pytest.mark.slow]

AUTH = {"Authorization": f"Bearer {KEY}"}


def _agent(stack: ExitStack, tmp: Path, name: str, region: str, window: int) -> str:
    base = yaml.safe_load((REPO / "configs" / "edge-local.yaml").read_text())
    engine = {"ctx_per_slot": window, "slots": 2, "n_threads": 1, "chunk_tokens": 64}
    base["engine"].update(engine, default_max_tokens=16)
    cfg = tmp / f"{name}.yaml"
    cfg.write_text(yaml.safe_dump(base))
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    args = ["edge_agent", "serve", "--config", str(cfg), "--port", str(port)]
    stack.enter_context(service_process([*args, "--region", region, "--id", name], url))
    return url


@pytest.fixture(scope="module")
def agents(tmp_path_factory: pytest.TempPathFactory, model_path: Path) -> Iterator[list[Any]]:
    tmp = tmp_path_factory.mktemp("windows")
    with ExitStack() as stack:
        small = _agent(stack, tmp, "edge-small", "east", 256)
        large = _agent(stack, tmp, "center-large", "center", 1024)
        yield [
            upstream(small, id="edge-small"),
            upstream(large, tier="center", region="center", id="center-large"),
        ]


def _router(ups: list[Any], **routing: Any) -> Iterator[str]:
    # A big center bias: only the window may send a simple request to the center.
    base = {"ttft_deadline_s": 180.0, "slow_start_s": 0, "center_bias_ms": 5000}
    app = create_app(router_settings(ups, routing={**base, **routing}))
    with UvicornThread(app, http=HeadWithBodyProtocol) as server:
        for _ in range(100):  # until both windows are known from /load
            found = _explain(server.url, [{"role": "user", "content": "hi"}])
            if all(c["max_context_tokens"] for c in found["candidates"]):
                break
            time.sleep(0.1)
        yield server.url


@pytest.fixture(scope="module")
def router(agents: list[Any]) -> Iterator[str]:
    yield from _router(agents)


@pytest.fixture(scope="module")
def trimming_router(agents: list[Any]) -> Iterator[str]:
    """The local topology's policy: trim only what no tier can hold whole."""
    last_resort = {"enabled": True, "last_resort": True}
    yield from _router(agents, trimming={"edge": last_resort, "center": last_resort})


def _explain(url: str, messages: list[dict[str, str]]) -> dict[str, Any]:
    body = {"model": "auto", "max_tokens": 8, "messages": messages}
    r = httpx.post(url + "/v1/route/explain", json=body, headers=AUTH, timeout=10)
    assert r.status_code == 200, r.text
    result: dict[str, Any] = r.json()
    return result


def _history(turns: int) -> list[dict[str, str]]:
    return [
        {
            "role": "user" if i % 2 == 0 else "assistant",
            "content": f"Turn {i}: we talked about gardens, roses and tulips. " * 6,
        }
        for i in range(turns)
    ]


def test_a_conversation_longer_than_the_edge_window_is_served_by_the_larger_one(
    router: str,
) -> None:
    short = [{"role": "user", "content": "Thanks, that was helpful!"}]
    windows = {c["id"]: c["max_context_tokens"] for c in _explain(router, short)["candidates"]}
    assert windows == {"edge-small": 256, "center-large": 1024}
    long = [*_history(8), {"role": "user", "content": "Thanks, that was helpful!"}]
    plan = _explain(router, long)
    assert plan["difficulty"] == "simple"
    assert 256 < plan["prompt_tokens"] < 1024
    assert [c["id"] for c in plan["candidates"]] == ["center-large"]
    body = {"model": "auto", "max_tokens": 8, "messages": long, "stream": False}
    r = httpx.post(router + "/v1/chat/completions", json=body, headers=AUTH, timeout=240)
    assert r.status_code == 200, r.text
    assert r.headers["x-route-instance"] == "center-large"
    assert r.json()["usage"]["prompt_tokens"] > 256  # the engine's own count: it did not fit
    # The short one still goes to the edge; one that fits nowhere gets the engine's 400.
    r = httpx.post(
        router + "/v1/chat/completions",
        json={**body, "messages": short},
        headers=AUTH,
        timeout=240,
    )
    assert r.headers["x-route-instance"] == "edge-small"
    huge = [*_history(40), {"role": "user", "content": "ok"}]
    r = httpx.post(
        router + "/v1/chat/completions", json={**body, "messages": huge}, headers=AUTH, timeout=240
    )
    assert r.status_code == 400
    assert r.json()["error"]["code"] == "context_length_exceeded"


def test_a_conversation_no_window_holds_is_trimmed_as_a_last_resort_and_says_so(
    trimming_router: str,
) -> None:
    body: dict[str, Any] = {"model": "auto", "max_tokens": 8, "stream": False}
    # Between the windows: the center holds it whole, nobody trims.
    between = [*_history(8), {"role": "user", "content": "Thanks, that was helpful!"}]
    plan = _explain(trimming_router, between)
    assert [(c["id"], c["trimmed"]) for c in plan["candidates"]] == [("center-large", None)]
    # Beyond every window: trimmed to a share of the chosen window, and it says so.
    huge = [*_history(40), {"role": "user", "content": "ok"}]
    plan = _explain(trimming_router, huge)
    assert plan["prompt_tokens"] > 1024
    assert plan["fits_a_window"] is True
    r = httpx.post(
        trimming_router + "/v1/chat/completions",
        json={**body, "messages": huge},
        headers=AUTH,
        timeout=240,
    )
    assert r.status_code == 200, r.text
    trimmed = dict(part.split("=") for part in r.headers["x-route-trimmed"].split("; "))
    window = 256 if r.headers["x-route-tier"] == "edge" else 1024
    assert trimmed["budget"] == str(int(window * 0.8) - 8)
    assert int(trimmed["dropped"]) > 0
    assert r.json()["usage"]["prompt_tokens"] <= window - 8


def test_a_tier_pinned_too_small_answers_400_naming_its_limit(router: str) -> None:
    """Not a 503: the pinned tier's own window refuses, and says by how much."""
    between = [*_history(8), {"role": "user", "content": "Thanks, that was helpful!"}]
    body = {"model": "edge", "max_tokens": 8, "messages": between, "stream": False}
    r = httpx.post(router + "/v1/chat/completions", json=body, headers=AUTH, timeout=240)
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert error["code"] == "context_length_exceeded"
    assert "256" in error["message"]


def test_one_message_longer_than_every_window_is_cut_inside_and_answered(
    trimming_router: str,
) -> None:
    """Issue 31: a pasted document with no history to drop, by the real engine's count."""
    document = (
        "Summarize this garden diary.\n"
        + "".join(f"Day {i}: the roses opened and the tulips closed. " for i in range(300))
        + "\nWhich flower did better?"
    )
    messages = [{"role": "user", "content": document}]
    plan = _explain(trimming_router, messages)
    assert plan["prompt_tokens"] > 1024
    assert all(c["trimmed"]["truncated_messages"] == 1 for c in plan["candidates"])
    body = {"model": "auto", "max_tokens": 8, "stream": False, "messages": messages}
    r = httpx.post(trimming_router + "/v1/chat/completions", json=body, headers=AUTH, timeout=240)
    assert r.status_code == 200, r.text
    trimmed = dict(part.split("=") for part in r.headers["x-route-trimmed"].split("; "))
    assert trimmed["truncated"] == "1"
    window = 256 if r.headers["x-route-tier"] == "edge" else 1024
    assert r.json()["usage"]["prompt_tokens"] <= window - 8
