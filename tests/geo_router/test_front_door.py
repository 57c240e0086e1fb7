"""The router's front door is servekit's: 413 closes the connection, anything unexpected
is a 500 in the OpenAI shape, validation errors name their parameter."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import httpx
import pytest
from asgi_lifespan import LifespanManager

from geo_router.app import create_app
from geo_router.settings import RouterSettings
from servekit.engine.protocol import LoadReport
from servekit.registry.protocol import InstanceInfo, InstanceState
from tests.geo_router.conftest import router_settings

pytestmark = pytest.mark.anyio

CHAT = {"model": "auto", "messages": [{"role": "user", "content": "hello there"}]}


class BrokenCatalog:
    """A candidate source that fails once told to (a bug the router did not foresee)."""

    def __init__(self) -> None:
        info = InstanceInfo("e", "edge", "east", "127.0.0.1", 9, "fake-model")
        self.states = [InstanceState(info, LoadReport(ready=True, capacity=4), True, time.time())]
        self.broken = False

    def __call__(self) -> list[InstanceState]:
        if self.broken:
            raise RuntimeError("catalog exploded")
        return self.states


@asynccontextmanager
async def router(
    settings: RouterSettings, catalog: BrokenCatalog
) -> AsyncIterator[httpx.AsyncClient]:
    app = create_app(settings, candidates=catalog)
    async with LifespanManager(app) as manager:
        transport = httpx.ASGITransport(app=manager.app, raise_app_exceptions=False)
        async with httpx.AsyncClient(transport=transport, base_url="http://router") as client:
            yield client


async def test_too_large_a_body_is_413_and_closes_the_connection(auth: dict[str, str]) -> None:
    async with router(router_settings([], max_body_bytes=1024), BrokenCatalog()) as c:
        big = {**CHAT, "messages": [{"role": "user", "content": "x" * 4096}]}
        for path in ("/v1/chat/completions", "/v1/route/explain"):
            r = await c.post(path, json=big, headers=auth)
            assert r.status_code == 413
            assert r.headers["connection"] == "close"  # the rest of the upload is not read
            assert r.json()["error"]["code"] == "request_too_large"
        metrics = (await c.get("/metrics")).text
        assert 'router_rejected_total{code="413"} 2.0' in metrics


async def test_an_unexpected_error_is_a_500_in_the_openai_shape(auth: dict[str, str]) -> None:
    catalog = BrokenCatalog()
    async with router(router_settings([]), catalog) as c:
        catalog.broken = True
        for method, path in (("POST", "/v1/chat/completions"), ("GET", "/v1/models")):
            r = await c.request(method, path, json=CHAT, headers=auth)
            assert r.status_code == 500, r.text
            assert r.json() == {
                "error": {
                    "message": "internal server error",
                    "type": "internal_error",
                    "param": None,
                    "code": None,
                }
            }
            assert "catalog exploded" not in r.text


async def test_explain_validates_as_its_path_says(auth: dict[str, str]) -> None:
    async with router(router_settings([]), BrokenCatalog()) as c:
        text = {"model": "auto", "prompt": "hello there"}
        r = await c.post("/v1/route/explain/completions", json=text, headers=auth)
        assert r.status_code == 200, r.text
        assert r.json()["instance"] == "e"
        r = await c.post("/v1/route/explain", json=text, headers=auth)  # chat: no messages
        assert r.status_code == 400
        assert r.json()["error"]["param"] == "messages"


DEEP = b'{"model": "auto", "messages": ' + b"[" * 100_000 + b"]" * 100_000 + b"}"
HOSTILE_BODIES = (
    DEEP,
    b'{"model": "auto", "messages": [{"role": "user", "content": "hi"}], "temperature": NaN}',
    b'{"model": "auto", "messages": [{"role": "user", "content": "hi"}], "seed": 1'
    + b"0" * 4000
    + b"}",
)


async def test_hostile_json_is_a_400_before_the_rate_limit(auth: dict[str, str]) -> None:
    keys = router_settings([]).auth.model_dump()["keys"]
    keys[0]["rpm"] = 1  # one routed request a minute, and hostile bodies must not spend it
    async with router(router_settings([], auth={"keys": keys}), BrokenCatalog()) as c:
        for raw in HOSTILE_BODIES:
            for path in ("/v1/chat/completions", "/v1/route/explain"):
                r = await c.post(path, content=raw, headers=auth)
                assert r.status_code == 400, r.text
                assert r.json()["error"]["code"] == "invalid_json"
        r = await c.post("/v1/route/explain", json=CHAT, headers=auth)
        assert r.status_code == 200  # the key's one request a minute is still unspent
        assert 'router_rejected_total{code="400"} 6.0' in (await c.get("/metrics")).text


@pytest.mark.parametrize(
    "field", ["ignore_eos", "min_tokens", "guided_regex", "chat_template", "priority", "cache_salt"]
)
async def test_engine_native_fields_are_an_unknown_parameter(
    auth: dict[str, str], field: str
) -> None:
    async with router(router_settings([]), BrokenCatalog()) as c:
        for path, body in (
            ("/v1/chat/completions", CHAT),
            ("/v1/completions", {"model": "auto", "prompt": "hi"}),
            ("/v1/route/explain", CHAT),
        ):
            r = await c.post(path, json={**body, field: 1}, headers=auth)
            assert r.status_code == 400, r.text
            assert r.json()["error"]["code"] == "unknown_parameter"
            assert r.json()["error"]["param"] == field
