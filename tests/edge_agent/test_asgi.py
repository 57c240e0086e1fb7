"""The edge agent in-process (ASGI transport): validation, errors, ops endpoints."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest
from asgi_lifespan import LifespanManager

from edge_agent.app import create_app

pytestmark = [pytest.mark.anyio, pytest.mark.model]

MODEL = "smollm2-135m-instruct"


@pytest.fixture(scope="module")
async def client(model_path: Any) -> AsyncIterator[httpx.AsyncClient]:
    from edge_agent.settings import EdgeSettings

    settings = EdgeSettings.model_validate(
        {
            "instance": {"id": "edge-asgi", "region": "test", "version": "v7"},
            "engine": {
                "model_path": str(model_path),
                "model_name": MODEL,
                "n_ctx": 256,
                "n_threads": 2,
                "warmup_tokens": 1,
            },
            "server": {"max_body_bytes": 4096},
        }
    )
    app = create_app(settings)
    async with LifespanManager(app) as manager:
        transport = httpx.ASGITransport(app=manager.app)
        async with httpx.AsyncClient(transport=transport, base_url="http://edge") as c:
            for _ in range(600):
                if (await c.get("/ready")).status_code == 200:
                    break
                await asyncio.sleep(0.05)
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
    assert data["usage"]["completion_tokens"] <= 2
    assert r.headers["x-model-version"] == "v7"
    r = await client.post(
        "/v1/completions", json={"model": "edge", "prompt": "Once", "max_tokens": 2}
    )
    assert r.status_code == 200
    assert r.json()["object"] == "text_completion"


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
    models = (await client.get("/v1/models")).json()
    assert [m["id"] for m in models["data"]] == [MODEL, "edge"]
    assert (await client.get("/health")).json() == {"status": "ok"}
    assert (await client.get("/ready")).status_code == 200
    load = (await client.get("/load")).json()
    assert load["ready"] is True
    assert load["capacity"] == 1
    assert load["version"] == "v7"
    assert load["requests_ok"] >= 1
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
    assert 'outcome="client_error"' in text


async def test_batching_engine_behind_the_agent(model_path: Any) -> None:
    from edge_agent.settings import EdgeSettings

    settings = EdgeSettings.model_validate(
        {
            "engine": {
                "kind": "llama-batching",
                "model_path": str(model_path),
                "model_name": MODEL,
                "slots": 2,
                "ctx_per_slot": 256,
                "chunk_tokens": 32,
                "warmup_tokens": 1,
            },
        }
    )
    app = create_app(settings)
    async with LifespanManager(app) as manager:
        transport = httpx.ASGITransport(app=manager.app)
        async with httpx.AsyncClient(transport=transport, base_url="http://edge", timeout=60) as c:
            for _ in range(600):
                if (await c.get("/ready")).status_code == 200:
                    break
                await asyncio.sleep(0.05)
            results = await asyncio.gather(
                *(c.post("/v1/chat/completions", json=body(max_tokens=4)) for _ in range(3))
            )
            assert [r.status_code for r in results] == [200, 200, 200]
            assert (await c.get("/load")).json()["capacity"] == 2
            r = await c.post("/v1/chat/completions", json=body(max_tokens=300))
            assert_openai_error(r, 400, "max_tokens")
            metrics = (await c.get("/metrics")).text
            assert "servekit:batch_size_sequences" in metrics


async def test_a_ttft_budget_sheds_at_once_and_shows_in_load_and_metrics(model_path: Any) -> None:
    from edge_agent.settings import EdgeSettings

    settings = EdgeSettings.model_validate(
        {
            "engine": {
                "model_path": str(model_path),
                "model_name": MODEL,
                "n_ctx": 512,
                "n_threads": 2,
                "warmup_tokens": 1,
            },
            "admission": {"max_waiting": 8, "ttft_budget_ms": 200},
        }
    )
    app = create_app(settings)
    async with LifespanManager(app) as manager:
        transport = httpx.ASGITransport(app=manager.app)
        async with httpx.AsyncClient(transport=transport, base_url="http://edge", timeout=60) as c:
            for _ in range(600):
                if (await c.get("/ready")).status_code == 200:
                    break
                await asyncio.sleep(0.05)
            long = asyncio.create_task(
                c.post("/v1/chat/completions", json=body(max_tokens=200, ignore_eos=True))
            )
            for _ in range(200):
                if (await c.get("/load")).json()["running"] == 1:
                    break
                await asyncio.sleep(0.01)
            load = (await c.get("/load")).json()
            assert load["ttft_budget_ms"] == 200
            assert load["predicted_wait_ms"] > 200  # one slot, held ~1 s by the first guess
            assert load["max_context_tokens"] == 512
            started = asyncio.get_running_loop().time()
            shed = await c.post("/v1/chat/completions", json=body())
            assert asyncio.get_running_loop().time() - started < 0.5  # refused, not queued
            assert_openai_error(shed, 429)
            assert shed.json()["error"]["code"] == "queue_full"
            assert int(shed.headers["retry-after"]) >= 1
            metrics = (await c.get("/metrics")).text
            assert "servekit:ttft_budget_seconds" in metrics
            assert "servekit:predicted_wait_seconds" in metrics
            assert 'outcome="rejected"' in metrics
            assert (await long).status_code == 200
