"""CatalogView: follows the catalog, serves last-known through outages, recovers."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry

from hybrid_llm.local.servers import UvicornThread, free_port
from servekit.engine.protocol import LoadReport
from servekit.registry.consul import ConsulRegistry
from servekit.registry.embedded import EmbeddedRegistry
from servekit.registry.protocol import InstanceInfo
from servekit.registry.view import CatalogView
from tests.registry.conftest import consul_datacenter, consul_settings
from tests.registry.consul_double import ConsulDouble

pytestmark = pytest.mark.anyio


def _info(id: str, tier: str = "edge", region: str = "eu") -> InstanceInfo:
    return InstanceInfo(
        id=id,
        tier=tier,
        region=region,
        address="127.0.0.1",
        port=8101,
        model="m",  # type: ignore[arg-type]
    )


async def _until(check: Callable[[], bool], within_s: float, what: str) -> None:
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        if check():
            return
        await asyncio.sleep(0.05)
    raise AssertionError(f"not {what} within {within_s}s")


def _ids(view: CatalogView) -> list[str]:
    return sorted(s.info.id for s in view.snapshot())


async def test_view_follows_changes_and_filters(tmp_path: Path) -> None:
    registry = EmbeddedRegistry(tmp_path / "r.db")
    view = CatalogView(registry, wait_s=2.0)
    await view.start()
    try:
        assert await view.wait_fresh(3.0)
        assert view.snapshot() == []
        await registry.register(_info("e1"), 30)
        await registry.register(_info("c1", tier="center", region="us"), 30)
        await registry.heartbeat("e1", LoadReport(ready=True, running=1))
        started = time.monotonic()
        await _until(lambda: _ids(view) == ["c1", "e1"], 3.0, "both seen")
        assert time.monotonic() - started < 1.5  # watches wake within about a second
        await _until(lambda: view.snapshot(tier="edge")[0].load.running == 1, 3.0, "load seen")
        assert [s.info.id for s in view.snapshot(tier="center", region="us")] == ["c1"]
        assert view.snapshot(region="nowhere") == []
        assert not view.stale
    finally:
        await view.aclose()
        await registry.aclose()


def _gauge(metrics: CollectorRegistry, name: str) -> float:
    value = metrics.get_sample_value(name)
    assert value is not None, name
    return value


async def test_view_serves_last_known_while_consul_is_down_and_recovers() -> None:
    state = consul_datacenter()
    port = free_port()
    registry = ConsulRegistry(consul_settings(f"127.0.0.1:{port}"), environ={})
    metrics = CollectorRegistry()
    flips: list[bool] = []
    view = CatalogView(
        registry,
        wait_s=0.5,
        retry_initial_s=0.05,
        retry_max_s=0.2,
        on_stale=flips.append,
        metrics_registry=metrics,
    )
    try:
        with UvicornThread(ConsulDouble(state).app(), port=port):
            await registry.register(_info("e1"), 60)
            await view.start()
            assert await view.wait_fresh(3.0)
            await _until(lambda: _ids(view) == ["e1"], 3.0, "e1 seen")
            assert _gauge(metrics, "registry_catalog_stale") == 0
            assert _gauge(metrics, "registry_catalog_instances") == 1
        # The agent is gone (connection refused from now on).
        await _until(lambda: view.stale, 5.0, "stale")
        last = view.last_success
        assert last is not None
        assert _ids(view) == ["e1"]  # last-known, still served
        assert _gauge(metrics, "registry_catalog_stale") == 1
        await asyncio.sleep(0.5)
        assert view.stale
        assert view.last_success == last
        assert _gauge(metrics, "registry_catalog_last_success_timestamp_seconds") == last

        # It comes back (same state, same port); a change made now shows up.
        with UvicornThread(ConsulDouble(state).app(), port=port):
            await registry.register(_info("e2", region="us"), 60)
            await _until(lambda: not view.stale and _ids(view) == ["e1", "e2"], 5.0, "recovered")
            assert _gauge(metrics, "registry_catalog_stale") == 0
            assert flips == [False, True, False]
            assert (view.last_success or 0) > last
            await view.aclose()
    finally:
        await view.aclose()
        await registry.aclose()


async def test_view_recovers_when_the_index_goes_backwards() -> None:
    state = consul_datacenter()
    with UvicornThread(ConsulDouble(state).app()) as server:
        registry = ConsulRegistry(consul_settings(server.url), environ={})
        view = CatalogView(registry, wait_s=0.5)
        try:
            await registry.register(_info("e1"), 60)
            await view.start()
            await _until(lambda: _ids(view) == ["e1"], 3.0, "e1 seen")
            state.rewind(by=1000)  # e.g. the cluster was restored from a snapshot
            seen = view.index
            await _until(lambda: view.index < seen, 3.0, "index reset")
            await registry.register(_info("e2"), 60)
            await _until(lambda: _ids(view) == ["e1", "e2"], 3.0, "change after reset")
            assert not view.stale
        finally:
            await view.aclose()
            await registry.aclose()
