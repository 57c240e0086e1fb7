"""The delay proxy on real sockets: added latency matches the configured RTT."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator

import httpx
import pytest

from hybrid_llm.bench import LoadStep, RunPlan, Variant, Workload, parse_bucket, run_plan
from hybrid_llm.local.netem import DelayProxy, ProxyRoute, parse_route
from hybrid_llm.local.servers import UvicornThread
from servekit.rtt import RttTable
from tests.hybrid_llm.fake_openai import Timing, create_app

RTT_MS = 60.0
SLACK_S = 0.025


async def _echo(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    while data := await reader.read(65536):
        writer.write(data)
        await writer.drain()
    writer.close()


@pytest.fixture
async def proxied_echo() -> AsyncIterator[int]:
    server = await asyncio.start_server(_echo, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    proxy = DelayProxy(ProxyRoute("127.0.0.1", 0, "127.0.0.1", port, RTT_MS))
    await proxy.start()
    yield proxy.port
    await proxy.aclose()
    server.close()
    await server.wait_closed()


@pytest.mark.anyio
async def test_round_trip_and_handshake_add_the_configured_rtt(proxied_echo: int) -> None:
    t0 = time.perf_counter()
    reader, writer = await asyncio.open_connection("127.0.0.1", proxied_echo)
    writer.write(b"hello")
    assert await reader.readexactly(5) == b"hello"
    first = time.perf_counter() - t0
    # Handshake round trip + the data round trip.
    assert 2 * RTT_MS / 1000 <= first <= 2 * RTT_MS / 1000 + SLACK_S

    rtts = []
    for i in range(5):
        t = time.perf_counter()
        writer.write(b"ping%d" % i)
        assert await reader.readexactly(5) == b"ping%d" % i
        rtts.append(time.perf_counter() - t)
    median = sorted(rtts)[2]
    assert RTT_MS / 1000 <= median <= RTT_MS / 1000 + SLACK_S

    # A megabyte is pipelined, not delayed chunk by chunk.
    blob = bytes(range(256)) * 4096
    t = time.perf_counter()
    writer.write(blob)
    assert await reader.readexactly(len(blob)) == blob
    assert time.perf_counter() - t < RTT_MS / 1000 + 0.5

    writer.write_eof()
    assert await asyncio.wait_for(reader.read(), 2) == b""
    writer.close()


@pytest.mark.anyio
async def test_bench_through_proxy_sees_rtt_on_ttft_but_not_itl() -> None:
    with UvicornThread(create_app(Timing(ttft=0.02, itl=0.01))) as srv:
        proxy = DelayProxy(ProxyRoute("127.0.0.1", 0, "127.0.0.1", srv.port, RTT_MS))
        await proxy.start()
        try:
            plan = RunPlan(
                url=f"http://127.0.0.1:{proxy.port}",
                workload=Workload("m", [parse_bucket("16:6")]),
                steps=[LoadStep("concurrency", 1)],
                variants=[Variant("v")],
                duration=10,
                max_requests=6,
                warmup=1,  # opens the keep-alive connection: later requests pay no handshake
            )
            records = (await run_plan(plan))[0].records
        finally:
            await proxy.aclose()
    ttft = sorted(r.ttft for r in records if r.ttft is not None)
    itl = sorted(g for r in records for g in r.itl)
    assert len(ttft) == 6
    assert 0.02 + RTT_MS / 1000 <= ttft[3] <= 0.02 + RTT_MS / 1000 + SLACK_S
    assert itl[len(itl) // 2] < 0.01 + 0.01


@pytest.mark.anyio
async def test_unreachable_upstream_closes_client() -> None:
    with UvicornThread(create_app(Timing())) as srv:
        dead_port = srv.port
    proxy = DelayProxy(ProxyRoute("127.0.0.1", 0, "127.0.0.1", dead_port, 2))
    await proxy.start()
    try:
        async with httpx.AsyncClient() as client:
            with pytest.raises(httpx.TransportError):
                await client.get(f"http://127.0.0.1:{proxy.port}/ready", timeout=2)
    finally:
        await proxy.aclose()


def test_route_parsing_and_rtt_table() -> None:
    assert parse_route("9101=127.0.0.1:8101@40") == ProxyRoute(
        "127.0.0.1", 9101, "127.0.0.1", 8101, 40.0
    )
    with pytest.raises(ValueError, match="LISTEN_PORT"):
        parse_route("9101:8101")
    table = RttTable(rtt_ms={"a": {"b": 30}}, same_region_ms=1, default_ms=99)
    assert table.rtt("b", "a") == 30
    assert table.rtt("a", "a") == 1
    assert table.rtt("a", "c") == 99
    assert table.one_way_s("a", "b") == pytest.approx(0.015)
