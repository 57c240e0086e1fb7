"""Token buckets for API-key limits: in this process, or shared by every router through Redis.

Several routers behind one load balancer must hold a key to one limit, not
one each. With ``auth.limits.backend: redis`` every bucket lives in Redis and
is refilled and taken in one server-side script (atomic, on the server's
clock, so routers need no clock agreement). When Redis does not answer within
``timeout_ms``, the router falls back to buckets of its own at the configured
rate divided by ``routers`` (the fleet as a whole then stays near the limit),
says so in ``router_limits_fallback`` and the log, and tries Redis again after
``retry_s``.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable
from typing import Literal, Protocol

from pydantic import Field

from servekit.config import Section

__all__ = [
    "Buckets",
    "LimitsSettings",
    "LocalBuckets",
    "RedisBuckets",
    "TokenBucket",
    "build_buckets",
]

log = logging.getLogger(__name__)


class LimitsSettings(Section):
    backend: Literal["local", "redis"] = Field(
        "local", description="Where buckets live: this process, or Redis shared by all routers."
    )
    redis_url: str = Field(
        "redis://127.0.0.1:6379/0",
        description="With backend redis; a password belongs in the URL or REDIS_PASSWORD-style "
        "secret files, never in logs (the URL is not logged).",
    )
    key_prefix: str = Field("hybrid-llm:limits:", min_length=1)
    timeout_ms: float = Field(
        50.0, gt=0, description="A Redis call slower than this counts as Redis unreachable."
    )
    retry_s: float = Field(5.0, gt=0, description="After a failure, local buckets for this long.")
    routers: int = Field(
        1, ge=1, description="Routers sharing the limits: the fallback allows 1/routers each."
    )


def capacity(rate_per_min: float, burst_s: float) -> float:
    """A bucket's size: ``burst_s`` seconds of the rate, at least one unit."""
    return max(1.0, rate_per_min / 60.0 * burst_s)


class TokenBucket:
    """``rate_per_min`` units per minute, bursting up to ``burst_s`` seconds' worth."""

    def __init__(self, rate_per_min: float, now: float, burst_s: float = 60.0) -> None:
        self.rate = rate_per_min / 60.0
        self.capacity = capacity(rate_per_min, burst_s)
        self.level = self.capacity
        self.stamp = now

    def take(self, amount: float, now: float) -> float:
        """Take ``amount``; 0.0 on success, else seconds until it would fit."""
        self.level = min(self.capacity, self.level + (now - self.stamp) * self.rate)
        self.stamp = now
        amount = min(amount, self.capacity)  # an oversized request waits for a full bucket
        if self.level >= amount:
            self.level -= amount
            return 0.0
        return (amount - self.level) / self.rate

    def give_back(self, amount: float) -> None:
        """Return ``amount``; a negative one is a debit, which may leave the bucket below
        zero (later requests then wait until it has refilled past what is owed)."""
        self.level = min(self.capacity, self.level + amount)


class Buckets(Protocol):
    """Named buckets: ``take`` answers 0.0 or the seconds until ``amount`` would fit;
    ``give_back`` returns ``amount`` to a bucket, or with a negative ``amount`` takes it
    whatever the level (a debit settled after the fact: it may go below zero)."""

    async def take(
        self, name: str, rate_per_min: float, burst_s: float, amount: float, now: float
    ) -> float: ...

    async def give_back(
        self, name: str, rate_per_min: float, burst_s: float, amount: float
    ) -> None: ...

    async def aclose(self) -> None: ...


class LocalBuckets:
    """Buckets in this process's memory; ``share`` scales every rate (1/routers on fallback)."""

    def __init__(self, share: float = 1.0) -> None:
        self._share = share
        self._buckets: dict[str, TokenBucket] = {}

    def _bucket(self, name: str, rate_per_min: float, burst_s: float, now: float) -> TokenBucket:
        bucket = self._buckets.get(name)
        if bucket is None:
            bucket = self._buckets[name] = TokenBucket(rate_per_min * self._share, now, burst_s)
        return bucket

    async def take(
        self, name: str, rate_per_min: float, burst_s: float, amount: float, now: float
    ) -> float:
        return self._bucket(name, rate_per_min, burst_s, now).take(amount, now)

    async def give_back(
        self, name: str, rate_per_min: float, burst_s: float, amount: float
    ) -> None:
        bucket = self._buckets.get(name)
        if bucket is not None:
            bucket.give_back(amount)

    async def aclose(self) -> None:
        return None


# KEYS[1]: the bucket; ARGV: rate per second, capacity, amount, idle expiry (ms).
# Refill and take in one step on the server's clock; the wait comes back as a
# string (a Lua number would be truncated to an integer reply).
_TAKE = """
local rate = tonumber(ARGV[1])
local capacity = tonumber(ARGV[2])
local amount = math.min(tonumber(ARGV[3]), capacity)
local t = redis.call('TIME')
local now = tonumber(t[1]) + tonumber(t[2]) / 1000000
local held = redis.call('HMGET', KEYS[1], 'level', 'stamp')
local level = tonumber(held[1]) or capacity
local stamp = tonumber(held[2]) or now
level = math.min(capacity, level + math.max(0, now - stamp) * rate)
local wait = 0
if level >= amount then level = level - amount else wait = (amount - level) / rate end
redis.call('HSET', KEYS[1], 'level', tostring(level), 'stamp', tostring(now))
redis.call('PEXPIRE', KEYS[1], ARGV[4])
return tostring(wait)
"""

_GIVE_BACK = """
local capacity = tonumber(ARGV[1])
local level = tonumber(redis.call('HGET', KEYS[1], 'level'))
if level then
  redis.call('HSET', KEYS[1], 'level', tostring(math.min(capacity, level + tonumber(ARGV[2]))))
end
return 0
"""


class RedisBuckets:
    """Buckets in Redis shared by all routers, with a per-process fallback when it is away."""

    def __init__(self, settings: LimitsSettings, on_fallback: Callable[[bool], None]) -> None:
        import redis.asyncio as aioredis  # only routers configured for Redis need the client
        import redis.exceptions

        self._errors = (redis.exceptions.RedisError, OSError)  # what "Redis is away" looks like

        timeout = settings.timeout_ms / 1000
        self._redis = aioredis.Redis.from_url(
            settings.redis_url,
            socket_timeout=timeout,
            socket_connect_timeout=timeout,
            retry_on_timeout=False,
        )
        self._prefix = settings.key_prefix
        self._retry_s = settings.retry_s
        self._routers = settings.routers
        self._fallback = LocalBuckets(share=1.0 / settings.routers)
        self._on_fallback = on_fallback
        self._down_until = 0.0
        self._down = False
        self._take = self._redis.register_script(_TAKE)
        self._give = self._redis.register_script(_GIVE_BACK)

    async def take(
        self, name: str, rate_per_min: float, burst_s: float, amount: float, now: float
    ) -> float:
        rate, size = rate_per_min / 60.0, capacity(rate_per_min, burst_s)
        expiry_ms = int(1000 * (size / rate + 60))
        args: list[str | int] = [repr(rate), repr(size), repr(float(amount)), expiry_ms]
        answer = await self._shared(lambda: self._take(keys=[self._prefix + name], args=args))
        if answer is None:
            return await self._fallback.take(name, rate_per_min, burst_s, amount, now)
        return float(answer.decode() if isinstance(answer, bytes) else str(answer))

    async def give_back(
        self, name: str, rate_per_min: float, burst_s: float, amount: float
    ) -> None:
        args = [repr(capacity(rate_per_min, burst_s)), repr(float(amount))]
        done = await self._shared(lambda: self._give(keys=[self._prefix + name], args=args))
        if done is None:
            await self._fallback.give_back(name, rate_per_min, burst_s, amount)

    async def _shared(self, call: Callable[[], Awaitable[object]]) -> object | None:
        """The script's answer, or None while Redis is away (then the fallback decides)."""
        if self._down and time.monotonic() < self._down_until:
            return None
        try:
            answer = await call()
        except self._errors as exc:
            self._down_until = time.monotonic() + self._retry_s
            if not self._down:
                self._down = True
                self._on_fallback(True)
                log.warning(
                    "limits backend unreachable (%s); per-router limits at 1/%d of each "
                    "rate for %.0f s before the next try",
                    type(exc).__name__,
                    self._routers,
                    self._retry_s,
                )
            return None
        if self._down:
            self._down = False
            self._on_fallback(False)
            log.warning("limits backend reachable again; limits are shared")
        return answer

    async def aclose(self) -> None:
        await self._redis.aclose()


def build_buckets(settings: LimitsSettings, on_fallback: Callable[[bool], None]) -> Buckets:
    if settings.backend == "redis":
        return RedisBuckets(settings, on_fallback)
    return LocalBuckets()
