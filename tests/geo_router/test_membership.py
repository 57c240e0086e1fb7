"""The router follows its catalog: a rejoining instance ramps up again; a model whose
instances are all draining is a 503 with Retry-After, not a 404."""

from __future__ import annotations

import time

import anyio
import httpx
import pytest
from asgi_lifespan import LifespanManager

from geo_router.app import create_app
from servekit.engine.protocol import LoadReport
from servekit.registry.protocol import InstanceInfo, InstanceState
from tests.geo_router.conftest import router_settings, serve_fake, upstream
from tests.geo_router.fake_upstream import Behavior

pytestmark = pytest.mark.anyio

CHAT = {"model": "auto", "messages": [{"role": "user", "content": "hello there"}]}


def _state(iid: str, region: str) -> InstanceState:
    info = InstanceInfo(iid, "edge", region, "127.0.0.1", 9, "fake-model")
    return InstanceState(info, LoadReport(ready=True, capacity=4), True, time.time())


async def _weights(c: httpx.AsyncClient, auth: dict[str, str]) -> dict[str, float]:
    r = await c.post("/v1/route/explain", json={**CHAT, "model": "edge"}, headers=auth)
    assert r.status_code == 200, r.text
    return {x["id"]: x["weight"] for x in r.json()["candidates"]}


async def test_an_instance_that_leaves_and_rejoins_gets_slow_start_again(
    auth: dict[str, str],
) -> None:
    listed = [_state("a", "east"), _state("b", "west")]
    settings = router_settings([], routing={"slow_start_s": 0.6}, poll_interval_s=0.05)
    app = create_app(settings, candidates=lambda: list(listed))
    async with LifespanManager(app) as manager:
        transport = httpx.ASGITransport(app=manager.app)
        async with httpx.AsyncClient(transport=transport, base_url="http://router") as c:
            await _weights(c, auth)  # seen from now on
            await anyio.sleep(0.7)
            assert await _weights(c, auth) == {"a": 1.0, "b": 1.0}  # ramped up
            gone = listed.pop(0)
            await anyio.sleep(0.3)  # a few catalog refreshes without it
            listed.append(gone)
            weights = await _weights(c, auth)
            assert weights["b"] == 1.0
            assert weights["a"] < 0.5  # cold again: back on the ramp


async def test_a_model_whose_only_instance_drains_is_503_with_retry_after(
    auth: dict[str, str],
) -> None:
    edge = Behavior(model="solo")
    with serve_fake(edge) as url:
        settings = router_settings([upstream(url, id="solo-1")], poll_interval_s=0.05)
        app = create_app(settings)
        async with LifespanManager(app) as manager:
            transport = httpx.ASGITransport(app=manager.app)
            async with httpx.AsyncClient(transport=transport, base_url="http://router") as c:
                body = {**CHAT, "model": "solo"}
                r = await c.post("/v1/chat/completions", json=body, headers=auth)
                assert r.status_code == 200
                edge.ready = False  # draining: /ready answers 503, the catalog drops it
                for _ in range(100):
                    r = await c.post("/v1/chat/completions", json=body, headers=auth)
                    if r.status_code != 200:
                        break
                    await anyio.sleep(0.05)
                assert r.status_code == 503, r.text
                assert r.headers["retry-after"] == "1"
                other = {**CHAT, "model": "nope"}
                r = await c.post("/v1/chat/completions", json=other, headers=auth)
                assert r.status_code == 404  # never listed: no such model
