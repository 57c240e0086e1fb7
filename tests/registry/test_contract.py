"""The registry contract: every backend must pass every test here.

Runs against the embedded SQLite store and against the Consul backend talking
to the HTTP double (see ``conftest.py``), whose agent runs at Consul's default
timings unless a test's ``consul_timings`` marker says otherwise (and why).
Timing bounds are generous upper limits for a loaded machine; the behaviour
checked is what callers rely on.
"""

from __future__ import annotations

import asyncio
import time

import pytest

from servekit.engine.protocol import LoadReport
from servekit.registry.protocol import InstanceInfo, InstanceState, NotRegistered, Registry
from tests.registry.conftest import FAST_REAP

pytestmark = pytest.mark.anyio


def _info(id: str, tier: str = "edge", region: str = "eu", **kw: object) -> InstanceInfo:
    return InstanceInfo(
        id=id,
        tier=tier,  # type: ignore[arg-type]
        region=region,
        address="127.0.0.1",
        port=9000 + len(id),
        model="smollm2",
        **kw,  # type: ignore[arg-type]
    )


async def _until(predicate: object, within_s: float, what: str) -> None:
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        if await predicate():  # type: ignore[operator]
            return
        await asyncio.sleep(0.05)
    raise AssertionError(f"not {what} within {within_s}s")


def _ids(states: list[InstanceState]) -> list[str]:
    return sorted(s.info.id for s in states)


async def test_register_heartbeat_and_list_by_tier_and_region(registry: Registry) -> None:
    full = _info("e1", version="v3", capacity=4, tags=("gpu", "l4"), meta={"zone": "a"})
    await registry.register(full, ttl_s=10)
    await registry.register(_info("e2", region="us"), ttl_s=10)
    await registry.register(_info("c1", tier="center"), ttl_s=10)
    beat = LoadReport(ready=True, running=3, waiting=2, capacity=4, busy_ms_per_seq=31.5)
    await registry.heartbeat("e1", beat)

    assert _ids(await registry.instances()) == ["c1", "e1", "e2"]
    assert _ids(await registry.instances(tier="edge")) == ["e1", "e2"]
    assert _ids(await registry.instances(region="eu")) == ["c1", "e1"]
    assert _ids(await registry.instances(tier="edge", region="eu")) == ["e1"]
    assert await registry.instances(tier="center", region="us") == []

    (e1,) = await registry.instances(tier="edge", region="eu")
    assert e1.info == full
    assert e1.info.url == "http://127.0.0.1:9002"
    assert e1.healthy
    assert (e1.load.ready, e1.load.running, e1.load.waiting, e1.load.capacity) == (True, 3, 2, 4)
    assert e1.load.busy_ms_per_seq == 31.5  # the router's busy penalty travels with the beat
    assert abs(e1.last_heartbeat - time.time()) < 5


async def test_register_replaces_identity(registry: Registry) -> None:
    await registry.register(_info("e1", version="v1"), ttl_s=10)
    await registry.register(_info("e1", version="v2"), ttl_s=10)
    (state,) = await registry.instances()
    assert state.info.version == "v2"


async def test_unbeaten_instance_expires_and_a_beat_revives_it(registry: Registry) -> None:
    await registry.register(_info("e1"), ttl_s=0.6)
    await registry.heartbeat("e1", LoadReport(ready=True))

    async def expired() -> bool:
        return await registry.instances() == []

    await _until(expired, 3.0, "expired")
    (critical,) = await registry.instances(healthy_only=False)
    assert critical.info.id == "e1"
    assert not critical.healthy

    await registry.heartbeat("e1", LoadReport(ready=True, running=1))
    (revived,) = await registry.instances()
    assert revived.healthy
    assert revived.load.running == 1


# Consul reaps no earlier than 1m after a check turned critical, on a 30s tick.
@pytest.mark.consul_timings(**FAST_REAP)
async def test_reaped_or_deregistered_instance_is_not_registered(registry: Registry) -> None:
    await registry.register(_info("gone"), ttl_s=0.3)

    async def reaped() -> bool:
        return await registry.instances(healthy_only=False) == []

    await _until(reaped, 5.0, "reaped")
    with pytest.raises(NotRegistered):
        await registry.heartbeat("gone", LoadReport())

    await registry.register(_info("e1"), ttl_s=10)
    await registry.deregister("e1")
    assert await registry.instances(healthy_only=False) == []
    with pytest.raises(NotRegistered):
        await registry.heartbeat("e1", LoadReport())
    await registry.deregister("never-there")  # idempotent


async def test_watch_wakes_on_register_and_on_expiry(registry: Registry) -> None:
    index, states = await registry.watch_instances(0, timeout_s=1.0)
    assert index >= 1
    assert states == []

    async def register_later() -> None:
        await asyncio.sleep(0.3)
        await registry.register(_info("e1"), ttl_s=1.0)

    started = time.monotonic()
    async with asyncio.TaskGroup() as tg:
        tg.create_task(register_later())
        woke_index, states = await registry.watch_instances(index, timeout_s=10.0)
    assert time.monotonic() - started < 2.0
    assert woke_index != index
    assert _ids(states) == ["e1"]

    # Nobody beats it: the watch wakes again when it expires.
    started = time.monotonic()
    index = woke_index
    while states:
        index, states = await registry.watch_instances(index, timeout_s=5.0)
        assert time.monotonic() - started < 4.0
    assert states == []


async def test_watch_times_out_with_the_same_index_when_nothing_changes(
    registry: Registry,
) -> None:
    await registry.register(_info("e1"), ttl_s=30)
    index, _ = await registry.watch_instances(0, timeout_s=1.0)
    started = time.monotonic()
    again, states = await registry.watch_instances(index, timeout_s=0.5)
    elapsed = time.monotonic() - started
    assert again == index
    assert _ids(states) == ["e1"]
    assert 0.4 <= elapsed < 2.0


async def test_kv_get_put_delete_and_cas_conflicts(registry: Registry) -> None:
    assert await registry.get("desired/edge-1") is None
    assert await registry.put_if("desired/edge-1", b"v1", 0)
    assert not await registry.put_if("desired/edge-1", b"other", 0)  # exists already

    first = await registry.get("desired/edge-1")
    assert first is not None
    assert first.value == b"v1"
    assert first.modify_index > 0
    assert await registry.put_if("desired/edge-1", b"v2", first.modify_index)
    # A second writer holding the old index loses.
    assert not await registry.put_if("desired/edge-1", b"v2-lost", first.modify_index)
    second = await registry.get("desired/edge-1")
    assert second is not None
    assert second.value == b"v2"
    assert second.modify_index > first.modify_index
    assert second.create_index == first.create_index

    await registry.put("desired/edge-1", b"v3")
    assert not await registry.put_if("desired/edge-1", b"x", second.modify_index)

    await registry.delete("desired/edge-1")
    assert await registry.get("desired/edge-1") is None
    await registry.delete("desired/edge-1")  # idempotent
    assert await registry.put_if("desired/edge-1", b"fresh", 0)


async def test_prefix_listing(registry: Registry) -> None:
    await registry.put("plans/b", b"\x00\xffbinary")
    await registry.put("plans/a", b"")
    await registry.put("plansx", b"not under plans/")
    await registry.put("other/a", b"no")

    entries = await registry.list_prefix("plans/")
    assert [(e.key, e.value) for e in entries] == [("plans/a", b""), ("plans/b", b"\x00\xffbinary")]
    assert [e.key for e in await registry.list_prefix("plans")] == ["plans/a", "plans/b", "plansx"]
    assert await registry.list_prefix("none/") == []


async def test_watch_prefix_wakes_on_put_and_delete_only_under_it(registry: Registry) -> None:
    await registry.put("cfg/a", b"1")
    index, entries = await registry.watch_prefix("cfg/", 0, timeout_s=1.0)
    assert [e.key for e in entries] == ["cfg/a"]

    async def write_later(action: object) -> None:
        await asyncio.sleep(0.3)
        await action()  # type: ignore[operator]

    started = time.monotonic()
    async with asyncio.TaskGroup() as tg:
        tg.create_task(write_later(lambda: registry.put("cfg/b", b"2")))
        index2, entries = await registry.watch_prefix("cfg/", index, timeout_s=10.0)
    assert time.monotonic() - started < 2.0
    assert index2 > index
    assert [e.key for e in entries] == ["cfg/a", "cfg/b"]

    # A write elsewhere does not wake it.
    await registry.put("elsewhere/x", b"3")
    started = time.monotonic()
    same, _ = await registry.watch_prefix("cfg/", index2, timeout_s=0.5)
    assert same == index2
    assert time.monotonic() - started >= 0.4

    async with asyncio.TaskGroup() as tg:
        tg.create_task(write_later(lambda: registry.delete("cfg/a")))
        index3, entries = await registry.watch_prefix("cfg/", index2, timeout_s=10.0)
    assert index3 > index2
    assert [e.key for e in entries] == ["cfg/b"]


async def test_lock_is_exclusive_until_released(registry: Registry) -> None:
    held = await registry.acquire_lock("locks/rollout", "alice", ttl_s=10)  # Consul's minimum
    assert held is not None
    assert held.holder == "alice"
    assert await registry.acquire_lock("locks/rollout", "bob", ttl_s=10) is None
    assert await registry.renew_lock(held)
    assert await registry.acquire_lock("locks/rollout", "bob", ttl_s=10) is None

    await registry.release_lock(held)
    taken = await registry.acquire_lock("locks/rollout", "bob", ttl_s=10)
    assert taken is not None
    assert taken.session != held.session
    assert not await registry.renew_lock(held)
    await registry.release_lock(held)  # a stale handle releases nothing
    assert await registry.acquire_lock("locks/rollout", "carol", ttl_s=10) is None
    await registry.release_lock(taken)


# Consul refuses session TTLs under session_ttl_min (10s) and may keep a
# session for twice its TTL: waiting that out would take 20s and more.
@pytest.mark.consul_timings(session_ttl_min_s=0.5)
async def test_lock_expires_without_renewal(registry: Registry) -> None:
    held = await registry.acquire_lock("locks/rollout", "alice", ttl_s=0.5)
    assert held is not None
    assert await registry.acquire_lock("locks/rollout", "bob", ttl_s=10) is None

    taken = None
    deadline = time.monotonic() + 4.0  # Consul may keep a session up to 2x its TTL
    while taken is None and time.monotonic() < deadline:
        await asyncio.sleep(0.1)
        taken = await registry.acquire_lock("locks/rollout", "bob", ttl_s=10)
    assert taken is not None, "lock did not expire"
    assert not await registry.renew_lock(held)
    await registry.release_lock(taken)
