"""Static entries: health from real /ready and /load endpoints over HTTP."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator

import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, Response
from starlette.routing import Route

from hybrid_llm.local.servers import UvicornThread, free_port
from servekit.engine.protocol import LoadReport
from servekit.registry.protocol import InstanceInfo, RegistryError
from servekit.registry.settings import StaticEntry, StaticSettings
from servekit.registry.static import StaticRegistry, entry_info

pytestmark = pytest.mark.anyio


class Instance:
    """A tiny instance exposing /ready and (optionally) /load."""

    def __init__(self, *, with_load: bool) -> None:
        self.ready = True
        self.stall_s = 0.0  # how long /ready takes to answer
        self.load_stall_s = 0.0  # how long /load takes to answer
        self.load_asked = 0  # /load requests received
        self.load = LoadReport(ready=True, running=2, capacity=4, model="m", version="v1")
        routes = [Route("/ready", self._ready)]
        if with_load:
            routes.append(Route("/load", self._load))
        self.app = Starlette(routes=routes)

    async def _ready(self, request: Request) -> Response:
        await asyncio.sleep(self.stall_s)
        if self.ready:
            return PlainTextResponse("ok")
        return PlainTextResponse("draining", status_code=503)

    async def _load(self, request: Request) -> Response:
        self.load_asked += 1
        await asyncio.sleep(self.load_stall_s)
        return JSONResponse(self.load.to_dict())


async def test_static_entries_are_probed_and_watched() -> None:
    with_load, without_load = Instance(with_load=True), Instance(with_load=False)
    dead_port = free_port()
    with UvicornThread(with_load.app) as a, UvicornThread(without_load.app) as b:
        settings = StaticSettings(
            entries=[
                StaticEntry(url=a.url, tier="edge", region="eu", model="m", id="a"),
                StaticEntry(url=b.url + "/", tier="center", region="us", model="big"),
                StaticEntry(
                    url=f"http://127.0.0.1:{dead_port}", tier="edge", region="eu", model="m"
                ),
            ],
            probe_interval_s=0.1,
            probe_timeout_s=0.5,
        )
        registry = StaticRegistry(settings)
        await registry.start()
        try:
            healthy = await registry.instances()
            assert sorted(s.info.id for s in healthy) == ["a", b.url]
            assert [s.info.id for s in await registry.instances(tier="center")] == [b.url]
            everything = await registry.instances(healthy_only=False)
            assert len(everything) == 3
            (state_a,) = await registry.instances(region="eu")
            assert state_a.load.running == 2
            assert state_a.load.version == "v1"
            assert abs(state_a.last_heartbeat - time.time()) < 5
            (state_b,) = await registry.instances(region="us")
            assert state_b.load == LoadReport()  # no /load endpoint: defaults

            index, _ = await registry.watch_instances(0, 1.0)
            with_load.ready = False
            started = time.monotonic()
            index2, states = await registry.watch_instances(index, 5.0)
            assert time.monotonic() - started < 2.0
            assert index2 != index
            assert [s.info.id for s in states] == [b.url]

            with_load.ready = True
            with_load.load = LoadReport(ready=True, running=3, capacity=4)
            index3, states = await registry.watch_instances(index2, 5.0)
            assert index3 != index2
            assert sorted(s.info.id for s in states) == ["a", b.url]
        finally:
            await registry.aclose()


async def test_static_writes_are_noops_and_kv_is_refused() -> None:
    registry = StaticRegistry(StaticSettings())
    await registry.start()
    try:
        info = InstanceInfo(id="x", tier="edge", region="eu", address="h", port=1, model="m")
        await registry.register(info, 10)
        await registry.heartbeat("x", LoadReport())
        await registry.deregister("x")
        assert await registry.instances(healthy_only=False) == []
        with pytest.raises(RegistryError, match="no KV store"):
            await registry.put("k", b"v")
        with pytest.raises(RegistryError):
            await registry.acquire_lock("k", "me", 5)
        started = time.monotonic()
        await registry.watch_instances(1, 0.2)  # nothing changes: times out
        assert time.monotonic() - started >= 0.15
    finally:
        await registry.aclose()


def test_entry_urls_become_instance_addresses() -> None:
    info = entry_info(
        StaticEntry(url="https://edge.example:8443/", tier="edge", region="eu", model="m")
    )
    assert (info.id, info.address, info.port) == ("https://edge.example:8443", "edge.example", 8443)
    assert (
        entry_info(StaticEntry(url="http://[::1]", tier="edge", region="eu", model="m")).port == 80
    )
    with pytest.raises(ValueError, match="http"):
        entry_info(StaticEntry(url="edge:8000", tier="edge", region="eu", model="m"))


@pytest.fixture
async def probing() -> AsyncIterator[tuple[Instance, StaticRegistry]]:
    """One instance with /load, and a started registry probing it every 50 ms."""
    instance = Instance(with_load=True)
    with UvicornThread(instance.app) as a:
        settings = StaticSettings(
            entries=[StaticEntry(url=a.url, tier="edge", region="eu", model="m")],
            probe_interval_s=0.05,
        )
        registry = StaticRegistry(settings)
        await registry.start()
        try:
            yield instance, registry
        finally:
            await registry.aclose()  # a no-op when the test closed it


async def test_probe_loop_keeps_running(probing: tuple[Instance, StaticRegistry]) -> None:
    instance, registry = probing
    instance.load = LoadReport(ready=True, running=7)
    deadline = time.monotonic() + 3
    while (await registry.instances())[0].load.running != 7:
        assert time.monotonic() < deadline
        await asyncio.sleep(0.05)


async def test_an_unanswered_probe_is_an_outage_only_when_repeated() -> None:
    """One probe timing out (a busy host) keeps the entry; ``unreachable_after`` in a
    row take it out; an answer brings it back; a 503 takes it out at once."""
    instance = Instance(with_load=True)
    with UvicornThread(instance.app) as a:
        settings = StaticSettings(
            entries=[StaticEntry(url=a.url, tier="edge", region="eu", model="m", id="a")],
            probe_timeout_s=0.2,
            unreachable_after=3,
        )
        registry = StaticRegistry(settings)
        try:

            async def healthy() -> bool:
                await registry.probe_once()
                return [s.info.id for s in await registry.instances()] == ["a"]

            assert await healthy()
            instance.stall_s = 0.5
            assert [await healthy() for _ in range(4)] == [True, True, False, False]
            instance.stall_s = 0.0
            assert await healthy()
            instance.stall_s = 0.5
            assert await healthy()  # the count starts again after an answer
            instance.stall_s = 0.0
            instance.ready = False
            assert not await healthy()
        finally:
            await registry.aclose()


async def test_a_load_refusing_our_token_warns_once_and_keeps_the_entry(
    caplog: pytest.LogCaptureFixture,
) -> None:
    async def refused(request: Request) -> Response:
        return JSONResponse({"error": {"message": "no key"}}, status_code=401)

    instance = Instance(with_load=False)
    instance.app.add_route("/load", refused)
    with UvicornThread(instance.app) as a:
        entry = StaticEntry(url=a.url, tier="edge", region="eu", model="m", id="a")
        registry = StaticRegistry(StaticSettings(entries=[entry], probe_timeout_s=2.0))
        try:
            with caplog.at_level(logging.WARNING):
                for _ in range(3):
                    await registry.probe_once()
            (state,) = await registry.instances()
            assert state.load == LoadReport()  # healthy from /ready, no report
        finally:
            await registry.aclose()
    warned = [r.getMessage() for r in caplog.records if "refused the service token" in r.message]
    assert warned == [f"{a.url} refused the service token (HTTP 401)"]


async def test_a_ready_refusing_our_token_warns_once_and_takes_the_entry_out(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """An upstream that guards /ready (ours leave it open): without a warning the entry
    stays out of the catalog with nothing but a debug line to say why."""

    async def refused(request: Request) -> Response:
        return JSONResponse({"error": {"message": "no key"}}, status_code=401)

    app = Starlette(routes=[Route("/ready", refused)])
    with UvicornThread(app) as a:
        entry = StaticEntry(url=a.url, tier="center", region="us", model="m", id="a")
        registry = StaticRegistry(StaticSettings(entries=[entry], load_path=None))
        try:
            with caplog.at_level(logging.WARNING):
                for _ in range(3):
                    await registry.probe_once()
            assert await registry.instances() == []
        finally:
            await registry.aclose()
    warned = [r.getMessage() for r in caplog.records if "refused the service token" in r.message]
    assert warned == [f"{a.url}/ready refused the service token (HTTP 401)"]


async def test_each_entry_carries_the_round_trip_its_load_reads_took() -> None:
    """A /load read is timed; an entry without /load has no measured round trip."""
    far, without_load = Instance(with_load=True), Instance(with_load=False)
    far.load_stall_s = 0.2  # as far as 200 ms away, seen from the reader
    with UvicornThread(far.app) as a, UvicornThread(without_load.app) as b:
        settings = StaticSettings(
            entries=[
                StaticEntry(url=a.url, tier="edge", region="eu", model="m", id="far"),
                StaticEntry(url=b.url, tier="edge", region="eu", model="m", id="no-load"),
            ],
            probe_interval_s=60.0,
        )
        registry = StaticRegistry(settings)
        await registry.start()
        try:
            rtts = {s.info.id: s.rtt_ms for s in await registry.instances()}
            assert rtts["no-load"] is None
            first = rtts["far"]
            assert first is not None
            assert first >= 200.0
            far.load_stall_s = 0.0
            await registry.probe_once()  # the least of the recent ones
            (now,) = [s.rtt_ms for s in await registry.instances() if s.info.id == "far"]
            assert now is not None
            assert now < first
        finally:
            await registry.aclose()


async def test_closing_lets_a_probe_round_under_way_finish(
    probing: tuple[Instance, StaticRegistry],
) -> None:
    """Cancelling a probe halfway through a TLS handshake leaks its socket (httpcore
    closes the stream on an error, not on a cancellation): closing waits for the
    round under way, which is seen here because its reading arrives."""
    instance, registry = probing
    instance.load_stall_s = 0.3
    instance.load = LoadReport(ready=True, running=7)
    asked = instance.load_asked
    while instance.load_asked == asked:  # noqa: ASYNC110 (the server's counter)
        await asyncio.sleep(0.01)
    await registry.aclose()  # the round under way has its /load stalled
    assert (await registry.instances())[0].load.running == 7
