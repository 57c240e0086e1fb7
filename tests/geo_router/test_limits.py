"""API-key limits shared by several routers through a real Redis, and the fallback without it."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager
from typing import Any

import anyio
import httpx
import pytest
from asgi_lifespan import LifespanManager

from geo_router.app import create_app
from geo_router.auth import RateLimiter, Tenant
from geo_router.limits import Buckets, LimitsSettings, LocalBuckets, RedisBuckets, TokenBucket
from geo_router.settings import RouterSettings
from servekit.errors import RateLimited
from tests.geo_router.conftest import KEY, router_settings, serve_fake, upstream
from tests.geo_router.fake_upstream import Behavior
from tests.support.redis import redis_server

pytestmark = pytest.mark.anyio

CHAT = {"model": "auto", "max_tokens": 4, "messages": [{"role": "user", "content": "hi"}]}
AUTH = {"Authorization": f"Bearer {KEY}"}


def _settings(url: str, limits: dict[str, Any], rpm: int) -> RouterSettings:
    settings = router_settings([upstream(url)], auth={"limits": limits})
    settings.auth.keys[0].rpm = rpm
    return settings


@asynccontextmanager
async def _routers(settings: RouterSettings, count: int) -> AsyncIterator[list[httpx.AsyncClient]]:
    """``count`` independent router apps (each its own process state) on the same settings."""
    async with AsyncExitStack() as stack:
        clients = []
        for _ in range(count):
            manager = await stack.enter_async_context(LifespanManager(create_app(settings)))
            transport = httpx.ASGITransport(app=manager.app, client=("127.0.0.1", 5555))
            clients.append(
                await stack.enter_async_context(
                    httpx.AsyncClient(transport=transport, base_url="http://router")
                )
            )
        yield clients


async def _alternate(clients: list[httpx.AsyncClient], n: int) -> list[int]:
    codes = []
    for i in range(n):
        r = await clients[i % len(clients)].post("/v1/chat/completions", json=CHAT, headers=AUTH)
        codes.append(r.status_code)
    return codes


async def test_two_routers_sharing_redis_allow_the_limit_once_not_twice() -> None:
    with serve_fake(Behavior()) as edge, redis_server() as redis:
        local = _settings(edge, {"backend": "local"}, rpm=4)
        async with _routers(local, 2) as clients:
            per_process = await _alternate(clients, 10)
        shared = _settings(
            edge, {"backend": "redis", "redis_url": redis.url, "timeout_ms": 1000}, 4
        )
        async with _routers(shared, 2) as clients:
            codes = await _alternate(clients, 10)
            r = await clients[1].post("/v1/chat/completions", json=CHAT, headers=AUTH)
            assert r.status_code == 429
            assert int(r.headers["retry-after"]) >= 1
            assert r.json()["error"]["type"] == "rate_limit_error"
            metrics = (await clients[0].get("/metrics")).text
    assert per_process.count(200) == 8  # what each router alone allows: twice the limit
    assert codes.count(200) == 4, codes
    assert codes.count(429) == 6, codes
    assert "router_limits_fallback 0.0" in metrics


async def test_without_redis_each_router_enforces_its_share_and_says_so(
    caplog: pytest.LogCaptureFixture,
) -> None:
    with serve_fake(Behavior()) as edge, redis_server() as redis:
        limits = {
            "backend": "redis",
            "redis_url": redis.url,
            "timeout_ms": 300,
            "retry_s": 0.3,
            "routers": 2,
        }
        async with _routers(_settings(edge, limits, rpm=4), 2) as clients:
            assert (await _alternate(clients, 1)) == [200]
            redis.stop()
            with caplog.at_level(logging.WARNING, logger="geo_router.limits"):
                codes = await _alternate(clients, 8)
            # each router alone allows 4 / 2 = 2 per minute: the fleet stays near the limit
            assert codes.count(200) == 4, codes
            assert "router_limits_fallback 1.0" in (await clients[0].get("/metrics")).text
            assert "limits backend unreachable" in caplog.text
            assert redis.url.split("@")[0] not in caplog.text  # the password never reaches logs
            assert "test-redis-secret" not in caplog.text
            redis.start()
            await anyio.sleep(0.4)
            await _alternate(clients, 2)  # back on the shared buckets
            assert "router_limits_fallback 0.0" in (await clients[0].get("/metrics")).text


async def test_concurrent_takes_on_redis_never_overspend_a_bucket() -> None:
    with redis_server() as redis:
        buckets = RedisBuckets(
            LimitsSettings(backend="redis", redis_url=redis.url, timeout_ms=2000),
            lambda down: None,
        )
        try:
            waits: list[float] = []

            async def take() -> None:
                waits.append(await buckets.take("rpm:k", 600, 1.0, 1, 0.0))

            async with anyio.create_task_group() as tg:
                for _ in range(40):
                    tg.start_soon(take)
        finally:
            await buckets.aclose()
    # 600/min bursting one second: a capacity of 10, refilling 10 per second
    granted = sum(1 for w in waits if w == 0.0)
    assert 10 <= granted <= 12, waits  # a few may refill while 40 calls go through
    assert max(waits) == pytest.approx(TokenBucket(600, 0.0, 1.0).take(11, 0.0), abs=0.15)


async def _settles_both_ways(buckets: Buckets) -> None:
    limiter = RateLimiter(buckets)
    tenant = Tenant("acme", "interactive", "k", tpm=1000, burst_s=60)
    await limiter.check(tenant, 100)
    assert await limiter.settle(tenant, 100, {"total_tokens": 40}) == 60  # given back
    await limiter.check(tenant, 100)  # 960 left before it: 860 after
    assert await limiter.settle(tenant, 100, {"total_tokens": 1000}) == -900  # taken
    with pytest.raises(RateLimited):  # -40 left: even a small request waits
        await limiter.check(tenant, 10)
    assert await limiter.settle(tenant, 100, {"total_tokens": True}) == 0  # nothing to trust
    assert await limiter.settle(tenant, 100, None) == 0


async def test_usage_beyond_the_charge_is_taken_from_local_buckets() -> None:
    await _settles_both_ways(LocalBuckets())


async def test_usage_beyond_the_charge_is_taken_from_redis_buckets() -> None:
    with redis_server() as redis:
        settings = LimitsSettings(backend="redis", redis_url=redis.url, timeout_ms=2000)
        buckets = RedisBuckets(settings, lambda down: None)
        try:
            await _settles_both_ways(buckets)
        finally:
            await buckets.aclose()
