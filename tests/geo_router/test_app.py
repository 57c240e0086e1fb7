"""In-process router tests (ASGITransport + asgi-lifespan) against real fake upstreams."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import anyio
import httpx
import pytest
from asgi_lifespan import LifespanManager

from geo_router.app import create_app
from geo_router.auth_settings import hash_key
from geo_router.conversation import estimate_prompt_tokens
from geo_router.settings import RouterSettings
from tests.geo_router.conftest import BATCH_KEY, router_settings, serve_fake, upstream
from tests.geo_router.fake_upstream import Behavior

pytestmark = pytest.mark.anyio


@asynccontextmanager
async def router(settings: RouterSettings) -> AsyncIterator[httpx.AsyncClient]:
    app = create_app(settings)
    async with LifespanManager(app) as manager:
        transport = httpx.ASGITransport(app=manager.app, client=("127.0.0.1", 5555))
        async with httpx.AsyncClient(transport=transport, base_url="http://router") as client:
            yield client


CHAT = {"model": "auto", "messages": [{"role": "user", "content": "hello there"}]}


def _sse(text: str) -> list[Any]:
    out: list[Any] = []
    for line in text.split("\n"):
        if line.startswith("data: "):
            data = line[6:]
            out.append(data if data == "[DONE]" else json.loads(data))
    return out


async def test_auth_size_and_validation_errors_use_the_openai_shape(
    auth: dict[str, str],
) -> None:
    edge = Behavior()
    with serve_fake(edge) as url:
        async with router(router_settings([upstream(url)], max_body_bytes=2048)) as c:
            r = await c.post("/v1/chat/completions", json=CHAT)
            assert r.status_code == 401
            assert r.json()["error"]["type"] == "authentication_error"
            r = await c.post("/v1/chat/completions", json=CHAT, headers={"Authorization": "x"})
            assert r.status_code == 401
            big = {**CHAT, "messages": [{"role": "user", "content": "x" * 5000}]}
            r = await c.post("/v1/chat/completions", json=big, headers=auth)
            assert r.status_code == 413
            assert r.json()["error"]["code"] == "request_too_large"
            r = await c.post("/v1/chat/completions", content=b"{not json", headers=auth)
            assert r.status_code == 400
            assert r.json()["error"]["code"] == "invalid_json"
            bad = {**CHAT, "max_tokens": "5"}
            r = await c.post("/v1/chat/completions", json=bad, headers=auth)
            assert (r.status_code, r.json()["error"]["param"]) == (400, "max_tokens")
            r = await c.post("/v1/chat/completions", json={**CHAT, "model": "gpt-9"}, headers=auth)
            assert (r.status_code, r.json()["error"]["code"]) == (404, "model_not_found")
            r = await c.get("/nowhere")
            assert r.status_code == 404
            assert "error" in r.json()
    assert edge.seen == []  # nothing invalid reached an upstream


async def test_routes_non_streamed_chat_and_names_the_route(auth: dict[str, str]) -> None:
    edge = Behavior(model="small", words=4)
    with serve_fake(edge) as url:
        async with router(router_settings([upstream(url, id="edge-east-1")])) as c:
            r = await c.post("/v1/chat/completions", json=CHAT, headers=auth)
            assert r.status_code == 200, r.text
            body = r.json()
            assert body["object"] == "chat.completion"
            assert body["choices"][0]["message"]["content"] == "w0 w1 w2 w3"
            assert body["usage"]["completion_tokens"] == 4
            assert r.headers["x-route-tier"] == "edge"
            assert r.headers["x-route-instance"] == "edge-east-1"
            assert r.headers["x-route-region"] == "east"
            assert r.headers["x-route-reason"] == "simple"
    sent = edge.seen[0]
    assert sent["body"]["model"] == "small"  # the alias became the instance's model
    assert sent["headers"]["x-priority"] == "interactive"
    # Nothing cached there yet: the whole prompt is what its admission charges for.
    assert int(sent["headers"]["x-prefill-tokens"]) == estimate_prompt_tokens(CHAT)


async def test_streams_completions_and_forwards_batch_priority() -> None:
    edge = Behavior(words=3)
    with serve_fake(edge) as url:
        async with router(router_settings([upstream(url)])) as c:
            body = {"model": "fake-model", "prompt": "count: ", "stream": True}
            r = await c.post(
                "/v1/completions", json=body, headers={"Authorization": f"Bearer {BATCH_KEY}"}
            )
            assert r.status_code == 200
            assert r.headers["content-type"].startswith("text/event-stream")
            events = _sse(r.text)
            assert events[-1] == "[DONE]"
            assert "".join(e["choices"][0]["text"] for e in events[:-1]) == "w0 w1 w2"
            assert r.headers["x-route-reason"] == "model"
    assert edge.seen[0]["headers"]["x-priority"] == "batch"


async def test_hard_requests_go_to_the_center_simple_ones_to_the_edge(
    auth: dict[str, str],
) -> None:
    with serve_fake(Behavior(model="small")) as e, serve_fake(Behavior(model="big")) as ctr:
        ups = [upstream(e, id="edge"), upstream(ctr, "center", "center", id="center")]
        async with router(router_settings(ups)) as c:
            hard = {
                "model": "auto",
                "messages": [
                    {
                        "role": "user",
                        "content": "Prove that the halting problem is undecidable and derive "
                        "the consequences for static analysis of programs, step by step.",
                    }
                ],
            }
            r = await c.post("/v1/chat/completions", json=hard, headers=auth)
            assert (r.headers["x-route-tier"], r.headers["x-route-reason"]) == ("center", "hard")
            # The task type and the policy's score ride in their own header.
            task, _p, gap, rule = r.headers["x-route-task"].split("; ")
            assert (task, rule) == ("math", "rule=dial")
            assert float(gap.removeprefix("gap=")) >= 0.5
            r = await c.post("/v1/chat/completions", json=CHAT, headers=auth)
            assert (r.headers["x-route-tier"], r.headers["x-route-reason"]) == ("edge", "simple")
            r = await c.post("/v1/chat/completions", json={**CHAT, "model": "center"}, headers=auth)
            assert r.headers["x-route-reason"] == "pinned-tier"
            assert r.headers["x-route-tier"] == "center"
            models = (await c.get("/v1/models", headers=auth)).json()
            assert {m["id"] for m in models["data"]} >= {"auto", "edge", "center", "small", "big"}


async def test_explain_returns_the_decision_without_calling_an_engine(
    auth: dict[str, str],
) -> None:
    edge, ctr = Behavior(model="small"), Behavior(model="big")
    with serve_fake(edge) as e, serve_fake(ctr) as cu:
        ups = [upstream(e, region="west", id="edge-w"), upstream(cu, "center", "center", id="c")]
        async with router(router_settings(ups)) as c:
            r = await c.post("/v1/route/explain", json=CHAT, headers=auth)
            assert r.status_code == 200
            d = r.json()
            assert d["difficulty"] == "simple"
            assert (d["task"], d["policy_rule"]) == ("chat", "dial")
            assert d["task_score"] > 0.5
            assert d["score"] < 0.5
            assert d["region"] == "east"
            # The only edge is 60 ms away, the center 20 ms + its 30 ms bias: a spill.
            assert (d["instance"], d["reason"]) == ("c", "spill-center")
            assert [x["id"] for x in d["candidates"]] == ["c", "edge-w"]
            assert d["candidates"][1]["rtt_ms"] == 60.0
            r = await c.post("/v1/route/explain", json={"model": "auto"}, headers=auth)
            assert r.status_code == 400
    assert edge.seen == []
    assert ctr.seen == []


async def test_explain_prices_own_region_users_with_the_measured_rtt(
    auth: dict[str, str],
) -> None:
    """The table says 20 ms to the center; the router's /load polls timed the real
    path (a loopback): with ``region.measured_rtt`` a user in the router's region is
    priced with that, a user declared elsewhere with the table, and without it
    everyone with the table."""
    ctr = Behavior(model="big")
    with serve_fake(ctr) as cu:
        ups = [upstream(cu, "center", "center", id="c")]
        region = {"measured_rtt": True, "trusted_proxies": ["127.0.0.1/32"]}
        async with router(router_settings(ups, region=region)) as c:
            body = {**CHAT, "model": "center"}
            (own,) = (await c.post("/v1/route/explain", json=body, headers=auth)).json()[
                "candidates"
            ]
            assert own["rtt_source"] == "measured"
            assert own["measured_rtt_ms"] is not None
            assert own["rtt_ms"] == own["measured_rtt_ms"]
            west = {**auth, "X-Client-Region": "west"}
            r = await c.post("/v1/route/explain", json=body, headers=west)
            assert r.json()["region"] == "west"
            (far,) = r.json()["candidates"]
            assert (far["rtt_ms"], far["rtt_source"]) == (40.0, "table")
        async with router(router_settings(ups)) as c:
            (off,) = (await c.post("/v1/route/explain", json=body, headers=auth)).json()[
                "candidates"
            ]
            assert (off["rtt_ms"], off["rtt_source"]) == (20.0, "table")
            assert off["measured_rtt_ms"] is not None  # shown, not used


async def test_ready_reflects_healthy_upstreams_and_metrics_render(
    auth: dict[str, str],
) -> None:
    edge = Behavior(ready=False)
    with serve_fake(edge) as url:
        async with router(router_settings([upstream(url)])) as c:
            assert (await c.get("/health")).status_code == 200
            r = await c.get("/ready")
            assert r.status_code == 503
            assert r.json()["error"]["code"] == "not_ready"
            r = await c.post("/v1/chat/completions", json=CHAT, headers=auth)
            assert r.status_code == 503
            assert "retry-after" in r.headers
            edge.ready = True
            for _ in range(50):
                if (await c.get("/ready")).status_code == 200:
                    break
                await anyio.sleep(0.1)
            assert (await c.get("/ready")).status_code == 200
            r = await c.post("/v1/chat/completions", json=CHAT, headers=auth)
            assert r.status_code == 200
            text = (await c.get("/metrics")).text
            assert 'router_decisions_total{reason="simple",region="east",tier="edge"} 1.0' in text
            assert 'router_candidates{tier="edge"} 1.0' in text
            assert "router_added_latency_seconds_count 1.0" in text


async def test_rate_limit_answers_429_with_retry_after() -> None:
    with serve_fake(Behavior()) as url:
        settings = router_settings([upstream(url)])
        settings.auth.keys[0].rpm = 1
        async with router(settings) as c:
            headers = {"Authorization": "Bearer sk-test-router-key"}
            assert settings.auth.keys[0].sha256 == hash_key("sk-test-router-key")
            assert (await c.post("/v1/chat/completions", json=CHAT, headers=headers)).is_success
            r = await c.post("/v1/chat/completions", json=CHAT, headers=headers)
            assert r.status_code == 429
            assert r.json()["error"]["type"] == "rate_limit_error"
            assert int(r.headers["retry-after"]) >= 1
