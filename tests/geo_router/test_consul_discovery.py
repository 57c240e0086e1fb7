"""The router on Consul at a default agent's settings: live load, draining.

A Consul agent forwards a heartbeat that changes only figures minutes late
(``check_update_interval`` 5m), so the router takes figures from each
instance's ``/load`` and the catalog only for membership, health and
identity. Here the Consul double's agent runs at Consul's defaults; two edges
(real HTTP doubles serving ``/load``) register and beat through it as edge
agents do. Bounds count the router's poll rounds
(``router_load_polls_total``), not wall time.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable

import httpx
import pytest
from asgi_lifespan import LifespanManager

from geo_router.app import create_app
from hybrid_llm.local.servers import UvicornThread
from servekit.engine.protocol import LoadReport
from servekit.registry import ConsulSettings, Heartbeater, InstanceInfo
from servekit.registry.consul import ConsulRegistry
from tests.geo_router.conftest import KEY, router_settings, serve_fake
from tests.geo_router.fake_upstream import Behavior
from tests.registry.conftest import consul_datacenter
from tests.registry.consul_double import ConsulDouble, ConsulState

pytestmark = pytest.mark.anyio

POLL_S = 0.2
BODY = {"model": "auto", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}


def _load(b: Behavior) -> Callable[[], LoadReport]:
    return lambda: LoadReport.from_dict(
        {"ready": b.ready, "capacity": 4, "model": b.model, **b.load}
    )


class Fleet:
    def __init__(self, state: ConsulState, consul_url: str, edges: dict[str, tuple[Behavior, str]]):
        self.state = state
        self.consul_url = consul_url
        self.edges = edges
        self.beaters: dict[str, Heartbeater] = {}
        self.registry = ConsulRegistry(ConsulSettings(address=consul_url), environ={})

    async def start(self) -> None:
        for iid, (b, url) in self.edges.items():
            port = int(url.rsplit(":", 1)[1])
            info = InstanceInfo(iid, "edge", "east", "127.0.0.1", port, b.model, "v1", capacity=4)
            beater = Heartbeater(self.registry, info, _load(b), interval_s=0.2, ttl_s=10.0)
            await beater.start()
            self.beaters[iid] = beater
        for _ in range(200):
            if len([s for s in await self.registry.instances() if s.load.ready]) == len(self.edges):
                return
            await asyncio.sleep(0.02)
        raise AssertionError("edges not registered and ready")

    async def aclose(self) -> None:
        for beater in self.beaters.values():
            await beater.stop()
        await self.registry.aclose()

    async def catalog_load(self, iid: str) -> LoadReport:
        """What the catalog says (the servers' copy, read through the agent)."""
        return next(s.load for s in await self.registry.instances() if s.info.id == iid)


@contextlib.asynccontextmanager
async def _router(consul_url: str) -> AsyncIterator[httpx.AsyncClient]:
    registry = {
        "backend": "consul",
        "consul": {"address": consul_url, "min_watch_interval_s": 0.05},
    }
    app = create_app(router_settings([], registry=registry, poll_interval_s=POLL_S))
    async with LifespanManager(app) as manager:
        transport = httpx.ASGITransport(app=manager.app)
        async with httpx.AsyncClient(transport=transport, base_url="http://router") as client:
            client.headers["Authorization"] = f"Bearer {KEY}"
            yield client


async def _polls(client: httpx.AsyncClient) -> float:
    text = (await client.get("/metrics")).text
    for line in text.splitlines():
        if line.startswith('router_load_polls_total{outcome="ok"}'):
            return float(line.split()[-1])
    return 0.0


async def _within_rounds(
    client: httpx.AsyncClient, rounds: int, edges: int, seen: Callable[[], Awaitable[bool]]
) -> None:
    """``seen()`` holds before ``rounds`` more poll rounds over ``edges`` complete."""
    start = await _polls(client)
    for _ in range(500):
        if await seen():
            return
        if await _polls(client) >= start + rounds * edges:
            assert await seen(), f"not seen within {rounds} poll rounds"
            return
        await asyncio.sleep(0.01)
    raise AssertionError("the router stopped polling")


async def _queue_ms(client: httpx.AsyncClient) -> dict[str, float]:
    explain = (await client.post("/v1/route/explain", json=BODY)).json()
    return {c["id"]: c["queue_ms"] for c in explain["candidates"]}


async def test_load_and_draining_reach_the_router_at_default_agent_settings() -> None:
    state = consul_datacenter()  # Consul's defaults: figures-only beats wait 2.5-7.5 min
    b1, b2 = Behavior(model="m"), Behavior(model="m")
    with UvicornThread(ConsulDouble(state).app()) as consul, serve_fake(b1) as u1, serve_fake(
        b2
    ) as u2:  # fmt: skip
        fleet = Fleet(state, consul.url, {"e1": (b1, u1), "e2": (b2, u2)})
        await fleet.start()
        try:
            async with _router(consul.url) as client:
                assert await _queue_ms(client) == {"e1": 0.0, "e2": 0.0}

                # e2 gets busy: its beats carry it, but the agent holds them back...
                b2.load["waiting"] = 40

                async def e2_busy() -> bool:
                    return (await _queue_ms(client))["e2"] > 0

                await _within_rounds(client, 2, 2, e2_busy)
                assert (await fleet.catalog_load("e2")).waiting == 0  # the catalog: still idle
                for _ in range(4):
                    r = await client.post("/v1/chat/completions", json={**BODY, "stream": True})
                    assert r.headers["x-route-instance"] == "e1"

                # e1 drains (SIGTERM on an edge agent: /load says so, the beat warns).
                b1.ready = False
                b1.load["draining"] = True
                await fleet.beaters["e1"].draining()
                served = len(b1.seen)

                async def e1_out() -> bool:
                    return "e1" not in await _queue_ms(client)

                await _within_rounds(client, 2, 2, e1_out)
                for _ in range(4):
                    r = await client.post("/v1/chat/completions", json={**BODY, "stream": True})
                    assert r.status_code == 200
                    assert r.headers["x-route-instance"] == "e2"
                assert len(b1.seen) == served  # no new request reached the draining edge
                assert ("consul-double", "e1") in state.services  # ...still registered
                await fleet.beaters["e1"].stop()
                assert ("consul-double", "e1") not in state.services
        finally:
            await fleet.aclose()
