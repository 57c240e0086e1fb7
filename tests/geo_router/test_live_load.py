"""LiveLoad: the catalog's instances with the load their own /load reports."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import pytest
from prometheus_client import CollectorRegistry
from starlette.applications import Starlette
from starlette.responses import PlainTextResponse
from starlette.routing import Route

from geo_router.live_load import LiveLoad
from hybrid_llm.local.servers import UvicornThread
from servekit.engine.protocol import LoadReport
from servekit.registry import CatalogView, InstanceInfo
from servekit.registry.embedded import EmbeddedRegistry
from tests.geo_router.conftest import refused_url, serve_fake
from tests.geo_router.fake_upstream import Behavior

pytestmark = pytest.mark.anyio


@pytest.fixture
async def registry(tmp_path: Path) -> AsyncIterator[EmbeddedRegistry]:
    reg = EmbeddedRegistry(tmp_path / "r.db")
    yield reg
    await reg.aclose()


async def _listed(registry: EmbeddedRegistry, iid: str, url: str, catalog: LoadReport) -> None:
    host, port = url.rsplit("//", 1)[1].rsplit(":", 1)
    await registry.register(InstanceInfo(iid, "edge", "east", host, int(port), "m"), ttl_s=60)
    await registry.heartbeat(iid, catalog)


@contextlib.asynccontextmanager
async def _live(registry: EmbeddedRegistry, metrics: CollectorRegistry) -> AsyncIterator[LiveLoad]:
    view = CatalogView(registry, wait_s=0.5)
    await view.start()
    try:
        assert await view.wait_fresh(3.0)
        async with httpx.AsyncClient(timeout=1.0) as client:
            yield LiveLoad(view, lambda _info: client, 0.1, metrics_registry=metrics)
    finally:
        await view.aclose()


def _by_id(live: LiveLoad) -> dict[str, tuple[bool, LoadReport]]:
    return {s.info.id: (s.healthy, s.load) for s in live.snapshot()}


async def test_overlays_polled_load_and_judges_readiness(registry: EmbeddedRegistry) -> None:
    busy = Behavior(model="m", load={"waiting": 7, "running": 4})
    loading = Behavior(model="m", ready=False)
    metrics = CollectorRegistry()
    with serve_fake(busy) as u1, serve_fake(loading) as u2:
        idle = LoadReport(ready=True, capacity=4)
        await _listed(registry, "busy", u1, idle)
        await _listed(registry, "loading", u2, idle)  # the catalog's copy says ready
        async with _live(registry, metrics) as live:
            assert _by_id(live)["busy"][1] == idle  # not polled yet: the catalog's entry
            assert all(s.rtt_ms is None for s in live.snapshot())  # nor timed
            await live.poll_once()
            seen = _by_id(live)
            assert seen["busy"][0]
            assert (seen["busy"][1].waiting, seen["busy"][1].running) == (7, 4)
            assert not seen["loading"][0]  # its own /load says not ready
            assert metrics.get_sample_value("router_load_polls_total", {"outcome": "ok"}) == 2
            (state,) = [s for s in live.snapshot() if s.info.id == "busy"]
            assert state.last_heartbeat > 0
            assert state.rtt_ms is not None  # the poll's round trip, timed
            assert state.rtt_ms > 0


async def test_unreachable_twice_is_unhealthy_until_it_answers(
    registry: EmbeddedRegistry,
) -> None:
    gone = refused_url()
    await _listed(registry, "gone", gone, LoadReport(ready=True))
    async with _live(registry, CollectorRegistry()) as live:
        await live.poll_once()
        assert _by_id(live)["gone"][0]  # one failure may be a blip
        await live.poll_once()
        assert not _by_id(live)["gone"][0]


async def test_an_instance_without_a_report_keeps_the_catalog_entry(
    registry: EmbeddedRegistry, caplog: pytest.LogCaptureFixture
) -> None:
    async def denied(request: object) -> PlainTextResponse:
        return PlainTextResponse("no key", status_code=401)

    app = Starlette(routes=[Route("/load", denied)])
    metrics = CollectorRegistry()
    with UvicornThread(app) as locked:
        catalog = LoadReport(ready=True, waiting=2)
        await _listed(registry, "locked", locked.url, catalog)
        async with _live(registry, metrics) as live:
            with caplog.at_level(logging.WARNING):
                await live.poll_once()
                await live.poll_once()
            assert _by_id(live)["locked"] == (True, catalog)
            warned = [r for r in caplog.records if "answered /load with 401" in r.message]
            assert len(warned) == 1  # once per instance
            assert (
                metrics.get_sample_value("router_load_polls_total", {"outcome": "no_report"}) == 2
            )


async def test_a_new_listing_is_polled_at_once(registry: EmbeddedRegistry) -> None:
    b = Behavior(model="m", load={"waiting": 3})
    with serve_fake(b) as url:
        async with _live(registry, CollectorRegistry()) as live:
            live.interval_s = 3600.0  # only the catalog follower can poll it in time
            task = asyncio.create_task(live.run())
            await asyncio.sleep(0.1)
            await _listed(registry, "new", url, LoadReport(ready=True))
            for _ in range(200):
                got = _by_id(live).get("new")
                if got is not None and got[1].waiting == 3:
                    break
                await asyncio.sleep(0.02)
            assert _by_id(live)["new"][1].waiting == 3
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
