"""Discovery and canary shares through the real embedded registry (a SQLite file)."""

from __future__ import annotations

import contextlib
import json
from collections.abc import AsyncIterator
from pathlib import Path

import anyio
import httpx
import pytest
from asgi_lifespan import LifespanManager

from geo_router.app import create_app
from geo_router.planner import canary_version
from servekit.engine.protocol import LoadReport
from servekit.registry import InstanceInfo, RegistrySettings, open_registry
from tests.geo_router.conftest import KEY, router_settings, serve_fake
from tests.geo_router.fake_upstream import Behavior

pytestmark = pytest.mark.anyio


@contextlib.asynccontextmanager
async def routed_by(
    registry: RegistrySettings, poll_interval_s: float
) -> AsyncIterator[httpx.AsyncClient]:
    """A router that finds its instances in ``registry``, and a client to it."""
    settings = router_settings(
        [], registry=registry.model_dump(mode="json"), poll_interval_s=poll_interval_s
    )
    async with LifespanManager(create_app(settings)) as manager:
        transport = httpx.ASGITransport(app=manager.app)
        async with httpx.AsyncClient(transport=transport, base_url="http://r") as client:
            yield client


async def test_router_finds_instances_and_canary_shares_in_the_registry(tmp_path: Path) -> None:
    reg_settings = RegistrySettings.model_validate(
        {"backend": "embedded", "embedded": {"path": str(tmp_path / "registry.db")}}
    )
    registry = await open_registry(reg_settings)
    v1, v2 = Behavior(model="m", version="v1"), Behavior(model="m", version="v2")
    try:
        with serve_fake(v1) as u1, serve_fake(v2) as u2:
            for iid, url, version in (("e1", u1, "v1"), ("e2", u2, "v2")):
                port = int(url.rsplit(":", 1)[1])
                info = InstanceInfo(iid, "edge", "east", "127.0.0.1", port, "m", version)
                await registry.register(info, ttl_s=60)
                await registry.heartbeat(iid, LoadReport(ready=True, capacity=4, model="m"))
            shares = {"v1": 0.5, "v2": 0.5}
            await registry.put("models/m/traffic", json.dumps({"shares": shares}).encode())
            async with routed_by(reg_settings, poll_interval_s=0.1) as c:
                assert (await c.get("/ready")).status_code == 200
                headers = {"Authorization": f"Bearer {KEY}"}
                for user in ("alice", "bob", "carol", "dave", "erin", "frank"):
                    body = {
                        "model": "auto",
                        "user": user,
                        "messages": [{"role": "user", "content": "hi"}],
                    }
                    want = canary_version(shares, f"m:{user}")
                    assert want is not None
                    for _ in range(2):  # sticky
                        r = await c.post("/v1/chat/completions", json=body, headers=headers)
                        assert r.status_code == 200
                        assert r.headers["x-route-instance"] == {"v1": "e1", "v2": "e2"}[want]
                metrics = (await c.get("/metrics")).text
                assert "router_catalog_stale 0.0" in metrics
    finally:
        await registry.aclose()
    assert v1.seen
    assert v2.seen  # six users at 50/50 reach both versions


async def test_ratings_reach_model_syncs_acceptance_figures(tmp_path: Path) -> None:
    """The router publishes its per-version counts where model_sync's gate reads them."""
    from model_sync.store import SyncStore

    reg_settings = RegistrySettings.model_validate(
        {"backend": "embedded", "embedded": {"path": str(tmp_path / "registry.db")}}
    )
    registry = await open_registry(reg_settings)
    try:
        with serve_fake(Behavior(model="m", version="v7")) as url:
            port = int(url.rsplit(":", 1)[1])
            await registry.register(
                InstanceInfo("e1", "edge", "east", "127.0.0.1", port, "m", "v7"), ttl_s=60
            )
            await registry.heartbeat("e1", LoadReport(ready=True, capacity=4, model="m"))
            async with routed_by(reg_settings, poll_interval_s=0.05) as c:
                headers = {"Authorization": f"Bearer {KEY}"}
                body = {"model": "auto", "messages": [{"role": "user", "content": "hi"}]}
                for thumbs in ("up", "up", "down"):
                    r = await c.post("/v1/chat/completions", json=body, headers=headers)
                    rating = {"response_id": r.json()["id"], "thumbs": thumbs}
                    got = await c.post("/v1/feedback", json=rating, headers=headers)
                    assert got.status_code == 200, got.text
                store = SyncStore(registry)
                for _ in range(100):  # published every poll interval (0.05 s)
                    counts = await store.feedback("m", "v7")
                    if counts.rated == 3:
                        break
                    await anyio.sleep(0.05)
                assert (counts.rated, counts.accepted) == (3, 2)
    finally:
        await registry.aclose()


async def test_a_registration_cannot_point_the_router_at_another_host(tmp_path: Path) -> None:
    """The router sends an instance's requests (with the fleet's token) to the address
    it registered, not to whatever its own meta says: a stolen edge registering
    ``meta.url`` of another service gets nothing sent there."""
    reg_settings = RegistrySettings.model_validate(
        {"backend": "embedded", "embedded": {"path": str(tmp_path / "registry.db")}}
    )
    registry = await open_registry(reg_settings)
    real, elsewhere = Behavior(model="m"), Behavior(model="m")
    try:
        with serve_fake(real) as url, serve_fake(elsewhere) as other_url:
            port = int(url.rsplit(":", 1)[1])
            info = InstanceInfo(
                "e1", "edge", "east", "127.0.0.1", port, "m", meta={"url": other_url}
            )
            await registry.register(info, ttl_s=60)
            await registry.heartbeat("e1", LoadReport(ready=True, capacity=4, model="m"))
            async with routed_by(reg_settings, poll_interval_s=0.1) as c:
                body = {"model": "auto", "messages": [{"role": "user", "content": "hi"}]}
                headers = {"Authorization": f"Bearer {KEY}"}
                r = await c.post("/v1/chat/completions", json=body, headers=headers)
                assert r.status_code == 200, r.text
    finally:
        await registry.aclose()
    assert not elsewhere.seen
    assert len(real.seen) == 1
