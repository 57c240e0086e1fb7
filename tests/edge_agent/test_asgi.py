"""The edge agent in-process (ASGI transport) over a scripted engine: answers,
validation, errors, admission and the ops endpoints. The real model behind
the agent is in ``test_model.py``."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from typing import Any

import httpx
import pytest

from edge_agent.settings import EdgeSettings
from tests.edge_agent.conftest import MODEL, ScriptedEngines, in_process, scripted_app

pytestmark = pytest.mark.anyio


@pytest.fixture
async def client(
    scripted_settings: Callable[..., EdgeSettings],
) -> AsyncIterator[httpx.AsyncClient]:
    settings = scripted_settings(
        instance__version="v7", engine__n_ctx=256, server__max_body_bytes=4096
    )
    async with in_process(scripted_app(settings)) as c:
        yield c


def body(**fields: Any) -> dict[str, Any]:
    out: dict[str, Any] = {"model": MODEL, "messages": [{"role": "user", "content": "Hi"}],
                           "max_tokens": 2, "temperature": 0}  # fmt: skip
    out.update(fields)
    return out


def assert_openai_error(resp: httpx.Response, status: int, param: str | None = None) -> None:
    assert resp.status_code == status, resp.text
    err = resp.json()["error"]
    assert set(err) == {"message", "type", "param", "code"}
    assert err["message"]
    if param is not None:
        assert err["param"] == param


async def test_chat_and_completion_succeed(client: httpx.AsyncClient) -> None:
    r = await client.post("/v1/chat/completions", json=body())
    assert r.status_code == 200
    data = r.json()
    assert data["object"] == "chat.completion"
    assert data["model"] == MODEL
    assert data["choices"][0]["message"] == {"role": "assistant", "content": "Hello from"}
    assert data["choices"][0]["finish_reason"] == "length"
    assert data["usage"]["completion_tokens"] == 2
    assert r.headers["x-model-version"] == "v7"
    r = await client.post(
        "/v1/completions", json={"model": "edge", "prompt": "Once", "max_tokens": 8}
    )
    assert r.status_code == 200
    assert r.json()["object"] == "text_completion"
    assert r.json()["choices"][0]["text"] == "Hello from the double"


@pytest.mark.parametrize(
    ("payload", "status", "param"),
    [
        (body(max_tokens=-1), 400, "max_tokens"),
        (body(max_tokens="3"), 400, "max_tokens"),
        (body(max_tokens=10_000), 400, "max_tokens"),
        (body(messages=[]), 400, "messages"),
        (body(messages="hello"), 400, "messages"),
        (body(temperature=-0.5), 400, "temperature"),
        (body(n=3), 400, "n"),
        (body(model="gpt-9"), 404, "model"),
        (body(messages=[{"role": "user", "content": "word " * 300}]), 400, "messages"),
        ({"messages": [{"role": "user", "content": "x"}]}, 400, "model"),
        ([1, 2, 3], 400, None),
        ("just a string", 400, None),
    ],
)
async def test_bad_input_gets_4xx_in_openai_shape(
    client: httpx.AsyncClient, payload: Any, status: int, param: str | None
) -> None:
    assert_openai_error(await client.post("/v1/chat/completions", json=payload), status, param)


async def test_malformed_json_and_wrong_content(client: httpx.AsyncClient) -> None:
    r = await client.post("/v1/chat/completions", content=b"{nope",
                          headers={"content-type": "application/json"})  # fmt: skip
    assert_openai_error(r, 400)
    assert r.json()["error"]["code"] == "invalid_json"
    r = await client.post(
        "/v1/chat/completions", content=b"\xff\xfe", headers={"content-type": "application/json"}
    )
    assert_openai_error(r, 400)


async def test_oversized_body_gets_413(client: httpx.AsyncClient) -> None:
    r = await client.post(
        "/v1/chat/completions", json=body(messages=[{"role": "user", "content": "x" * 5000}])
    )
    assert_openai_error(r, 413)


async def test_unknown_route_and_method(client: httpx.AsyncClient) -> None:
    assert_openai_error(await client.get("/v1/nothing"), 404)
    assert_openai_error(await client.get("/v1/chat/completions"), 405)


async def test_models_health_ready_load_metrics(client: httpx.AsyncClient) -> None:
    assert (await client.post("/v1/chat/completions", json=body())).status_code == 200
    too_long = body(messages=[{"role": "user", "content": "word " * 300}])
    assert (await client.post("/v1/chat/completions", json=too_long)).status_code == 400
    models = (await client.get("/v1/models")).json()
    assert [m["id"] for m in models["data"]] == [MODEL, "edge"]
    assert (await client.get("/health")).json() == {"status": "ok"}
    assert (await client.get("/ready")).status_code == 200
    load = (await client.get("/load")).json()
    assert load["ready"] is True
    assert load["capacity"] == 1
    assert load["version"] == "v7"
    assert load["requests_ok"] == 1
    text = (await client.get("/metrics")).text
    for name in (
        "vllm:time_to_first_token_seconds_bucket",
        "vllm:inter_token_latency_seconds_bucket",
        "vllm:e2e_request_latency_seconds_count",
        "vllm:request_queue_time_seconds_count",
        "vllm:prompt_tokens_total",
        "vllm:generation_tokens_total",
        "vllm:num_requests_running",
        "vllm:num_requests_waiting",
        "vllm:prefix_cache_hits_total",
        "hybrid_requests_total",
    ):
        assert name in text, name
    assert 'region="test"' in text
    assert 'tier="edge"' in text
    assert 'outcome="ok"' in text
    assert 'outcome="client_error"' in text


async def test_engine_status_names_kind_model_version_and_in_flight(
    client: httpx.AsyncClient,
) -> None:
    status = (await client.get("/engine")).json()
    assert status == {"kind": "llama", "model": MODEL, "version": "v7", "in_flight": 0}


async def test_ready_is_503_while_the_model_loads(
    scripted_settings: Callable[..., EdgeSettings],
) -> None:
    loaded = asyncio.Event()
    engines = ScriptedEngines(hold_start=loaded)
    async with in_process(scripted_app(scripted_settings(), engines), ready=False) as c:
        first = await c.get("/ready")
        assert first.status_code == 503
        assert first.json()["error"]["code"] == "not_ready"
        assert "retry-after" in first.headers
        early = await c.post("/v1/chat/completions", json=body())
        assert_openai_error(early, 503)
        assert engines.current.requests == []  # refused: nothing ran
        loaded.set()
        for _ in range(200):
            if (await c.get("/ready")).status_code == 200:
                break
            await asyncio.sleep(0.01)
        assert (await c.get("/ready")).status_code == 200
        assert (await c.post("/v1/chat/completions", json=body())).status_code == 200


async def test_a_full_queue_gets_429_with_retry_after_at_once(
    scripted_settings: Callable[..., EdgeSettings],
) -> None:
    engines = ScriptedEngines()
    settings = scripted_settings(admission__max_waiting=1)
    async with in_process(scripted_app(settings, engines)) as c:
        holding = [body(messages=[{"role": "user", "content": f"HOLD {i}"}]) for i in range(2)]
        held = [asyncio.create_task(c.post("/v1/chat/completions", json=b)) for b in holding]
        for _ in range(200):
            load = (await c.get("/load")).json()
            if (load["running"], load["waiting"]) == (1, 1):
                break
            await asyncio.sleep(0.01)
        assert (load["running"], load["waiting"]) == (1, 1)
        refused = await c.post("/v1/chat/completions", json=body())
        assert_openai_error(refused, 429)
        assert refused.json()["error"]["code"] == "queue_full"
        assert int(refused.headers["retry-after"]) >= 1
        engines.current.release.set()
        assert [(await t).status_code for t in held] == [200, 200]
        assert 'outcome="rejected"' in (await c.get("/metrics")).text


async def test_the_engines_prefill_backlog_of_the_moment_counts_against_the_budget(
    scripted_settings: Callable[..., EdgeSettings],
) -> None:
    """Free slots but seconds of prompts still to prefill: refused, with no /load poll between."""
    settings = scripted_settings(admission__ttft_budget_ms=500)
    engines = ScriptedEngines()
    async with in_process(scripted_app(settings, engines)) as c:
        assert (await c.post("/v1/chat/completions", json=body())).status_code == 200
        engines.current.prefill_backlog_ms = 2000.0
        shed = await c.post("/v1/chat/completions", json=body())
        assert_openai_error(shed, 429)
        assert "predicted wait 2000 ms" in shed.json()["error"]["message"]
        engines.current.prefill_backlog_ms = 100.0
        assert (await c.post("/v1/chat/completions", json=body())).status_code == 200


async def test_a_slot_held_by_long_work_counts_against_the_budget(
    scripted_settings: Callable[..., EdgeSettings],
) -> None:
    """The engine says its running sequence frees its slot in 3 s (a document still
    being read): a request that would queue for it is refused, though the requests
    so far held their slot for milliseconds; one that frees soon lets it queue."""
    settings = scripted_settings(admission__ttft_budget_ms=1000, admission__max_waiting=4)
    engines = ScriptedEngines()
    async with in_process(scripted_app(settings, engines)) as c:
        assert (await c.post("/v1/chat/completions", json=body())).status_code == 200
        hold = body(messages=[{"role": "user", "content": "HOLD long"}])
        held = asyncio.create_task(c.post("/v1/chat/completions", json=hold))
        for _ in range(200):
            if engines.current.running == 1:
                break
            await asyncio.sleep(0.01)
        engines.current.slot_releases = (3000.0,)
        shed = await asyncio.wait_for(c.post("/v1/chat/completions", json=body()), 10)
        assert_openai_error(shed, 429)
        assert "predicted wait 3000 ms" in shed.json()["error"]["message"]
        engines.current.slot_releases = (100.0,)
        queued = asyncio.create_task(c.post("/v1/chat/completions", json=body()))
        for _ in range(200):
            if (await c.get("/load")).json()["waiting"] == 1:
                break
            await asyncio.sleep(0.01)
        engines.current.release.set()
        assert [(await t).status_code for t in (held, queued)] == [200, 200]


async def test_the_requests_own_prefill_from_the_routers_count_counts_against_the_budget(
    scripted_settings: Callable[..., EdgeSettings],
) -> None:
    """An engine that cannot tell what it holds: the router's ``X-Prefill-Tokens`` at
    the engine's prefill rate is added to the wait; a bad header is ignored, not a 400."""
    settings = scripted_settings(admission__ttft_budget_ms=500)
    engines = ScriptedEngines()
    async with in_process(scripted_app(settings, engines)) as c:
        assert (await c.post("/v1/chat/completions", json=body())).status_code == 200
        engines.current.prefill_backlog_ms = 300.0
        engines.current.prefill_tokens_per_s = 1000.0
        cold = {"x-prefill-tokens": "400"}  # 400 ms here: 300 + 375 (its share) > 500
        shed = await c.post("/v1/chat/completions", json=body(), headers=cold)
        assert_openai_error(shed, 429)
        assert "own prefill 400 ms" in shed.json()["error"]["message"]
        warm = {"x-prefill-tokens": "50"}
        assert (await c.post("/v1/chat/completions", json=body(), headers=warm)).status_code == 200
        for bad in ("-5", "lots", "1" * 30):
            sent = await c.post(
                "/v1/chat/completions", json=body(), headers={"x-prefill-tokens": bad}
            )
            assert sent.status_code == 200


async def test_what_the_router_says_a_request_spent_counts_against_the_budget(
    scripted_settings: Callable[..., EdgeSettings],
) -> None:
    """``X-Waited-Ms``: the time a request spent where another edge refused it. Added
    to the wait, it refuses what would answer past the budget; a bad header is
    ignored, not a 400."""
    settings = scripted_settings(admission__ttft_budget_ms=500)
    engines = ScriptedEngines()
    async with in_process(scripted_app(settings, engines)) as c:
        assert (await c.post("/v1/chat/completions", json=body())).status_code == 200
        engines.current.prefill_backlog_ms = 300.0
        late = await c.post("/v1/chat/completions", json=body(), headers={"x-waited-ms": "250"})
        assert_openai_error(late, 429)
        assert "250 ms spent before" in late.json()["error"]["message"]
        early = {"x-waited-ms": "150"}
        assert (await c.post("/v1/chat/completions", json=body(), headers=early)).status_code == 200
        for bad in ("-5", "lots", "1" * 30):
            sent = await c.post("/v1/chat/completions", json=body(), headers={"x-waited-ms": bad})
            assert sent.status_code == 200


async def test_a_prompt_too_long_for_the_budget_waits_for_an_idle_edge(
    scripted_settings: Callable[..., EdgeSettings],
) -> None:
    """A cold prompt whose prefill alone (1.5 s) spends the budget (1 s): refused
    beside a running request, though nothing waits ahead of it, with a Retry-After
    of when the engine says its slot frees; taken once the edge is idle."""
    settings = scripted_settings(admission__ttft_budget_ms=1000)
    engines = ScriptedEngines(capacity=2)
    async with in_process(scripted_app(settings, engines)) as c:
        assert (await c.post("/v1/chat/completions", json=body())).status_code == 200
        hold = body(messages=[{"role": "user", "content": "HOLD"}])
        held = asyncio.create_task(c.post("/v1/chat/completions", json=hold))
        for _ in range(200):
            if engines.current.running == 1:
                break
            await asyncio.sleep(0.01)
        engines.current.prefill_tokens_per_s = 1000.0
        engines.current.slot_releases = (4000.0,)
        cold = {"x-prefill-tokens": "1500"}
        shed = await c.post("/v1/chat/completions", json=body(), headers=cold)
        assert_openai_error(shed, 429)
        assert "own prefill 1500 ms" in shed.json()["error"]["message"]
        assert shed.headers["retry-after"] == "4"
        engines.current.release.set()
        assert (await held).status_code == 200
        engines.current.slot_releases = ()
        taken = await c.post("/v1/chat/completions", json=body(), headers=cold)
        assert taken.status_code == 200


async def test_a_ttft_budget_sheds_at_once_and_shows_in_load_and_metrics(
    scripted_settings: Callable[..., EdgeSettings],
) -> None:
    settings = scripted_settings(engine__n_ctx=512, admission__max_waiting=8,
                                 admission__ttft_budget_ms=200)  # fmt: skip
    engines = ScriptedEngines()
    async with in_process(scripted_app(settings, engines)) as c:
        holding = body(messages=[{"role": "user", "content": "HOLD"}])
        long = asyncio.create_task(c.post("/v1/chat/completions", json=holding))
        for _ in range(200):
            if (await c.get("/load")).json()["running"] == 1:
                break
            await asyncio.sleep(0.01)
        load = (await c.get("/load")).json()
        assert load["ttft_budget_ms"] == 200
        # One slot, held, and no request finished yet to tell for how long: unknown.
        assert load["predicted_wait_ms"] is None
        assert load["max_context_tokens"] == 512
        started = asyncio.get_running_loop().time()
        shed = await c.post("/v1/chat/completions", json=body())
        assert asyncio.get_running_loop().time() - started < 0.5  # refused, not queued
        assert_openai_error(shed, 429)
        assert shed.json()["error"]["code"] == "queue_full"
        assert int(shed.headers["retry-after"]) >= 1
        metrics = (await c.get("/metrics")).text
        assert "servekit:ttft_budget_seconds" in metrics
        assert "servekit:predicted_wait_seconds" not in metrics  # unknown: not made up
        assert 'outcome="rejected"' in metrics
        engines.current.release.set()
        assert (await long).status_code == 200
        assert (await c.get("/load")).json()["predicted_wait_ms"] == 0.0  # a free slot
        assert "servekit:predicted_wait_seconds" in (await c.get("/metrics")).text


@pytest.mark.parametrize(
    "raw",
    [
        b'{"model": "m", "messages": '
        + b"[" * 1500
        + b"]" * 1500
        + b"}",  # past Python's recursion limit
        b'{"model": "m", "messages": [{"role": "user", "content": "hi"}], "top_p": Infinity}',
    ],
    ids=["deep", "infinity"],
)
async def test_hostile_json_is_a_400_not_a_500(client: httpx.AsyncClient, raw: bytes) -> None:
    for path in ("/v1/chat/completions", "/v1/completions"):
        r = await client.post(path, content=raw, headers={"content-type": "application/json"})
        assert_openai_error(r, 400)
        assert r.json()["error"]["code"] == "invalid_json"
