"""Heartbeater: registers, beats live load, survives expiry and outages."""

from __future__ import annotations

import asyncio
import sqlite3
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

import pytest

from hybrid_llm.local.servers import UvicornThread, free_port
from servekit.engine.protocol import LoadReport
from servekit.registry.consul import ConsulRegistry
from servekit.registry.embedded import EmbeddedRegistry
from servekit.registry.heartbeat import Heartbeater
from servekit.registry.protocol import InstanceInfo, InstanceState, Registry
from tests.registry.conftest import consul_datacenter, consul_settings
from tests.registry.consul_double import ConsulDouble

pytestmark = pytest.mark.anyio

INFO = InstanceInfo(
    id="edge-eu-1", tier="edge", region="eu", address="127.0.0.1", port=8101, model="smollm2"
)


async def _until(check: Callable[[], Awaitable[bool]], within_s: float, what: str) -> None:
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        if await check():
            return
        await asyncio.sleep(0.05)
    raise AssertionError(f"not {what} within {within_s}s")


async def _only(registry: Registry) -> InstanceState | None:
    states = await registry.instances()
    return states[0] if len(states) == 1 else None


# A Consul agent forwards a beat that changes only figures after
# check_update_interval (5m); 0 forwards each at once. At the default, see
# test_consul_backend's test_figures_lag_but_readiness_and_draining_do_not.
@pytest.mark.consul_timings(check_update_interval_s=0.0)
async def test_beats_live_load_then_drains_and_deregisters(registry: Registry) -> None:
    running = [0]
    beater = Heartbeater(
        registry, INFO, lambda: LoadReport(ready=True, running=running[0]), 0.1, 2.0
    )
    await beater.start()

    async def shows(n: int) -> bool:
        state = await _only(registry)
        return state is not None and state.load.ready and state.load.running == n

    await _until(lambda: shows(0), 3.0, "registered")
    running[0] = 2
    await _until(lambda: shows(2), 3.0, "load updated")

    await beater.draining()
    state = await _only(registry)
    assert state is not None
    assert state.load.draining
    assert not state.load.ready
    await asyncio.sleep(0.3)  # later beats keep saying draining
    state = await _only(registry)
    assert state is not None
    assert state.load.draining

    await beater.stop()
    assert await registry.instances(healthy_only=False) == []
    assert beater.failures == 0


async def test_mark_draining_from_a_sync_hook_publishes_at_once(tmp_path: Path) -> None:
    registry = EmbeddedRegistry(tmp_path / "r.db")
    # Beats are far apart: only the drain hook can publish in time.
    beater = Heartbeater(registry, INFO, lambda: LoadReport(ready=True), 30.0, 60.0)
    await beater.start()
    try:
        await _until(lambda: _is_listed(registry), 3.0, "registered")
        asyncio.get_running_loop().call_soon(beater.mark_draining)  # like a signal hook

        async def draining() -> bool:
            state = await _only(registry)
            return state is not None and state.load.draining and not state.load.ready

        await _until(draining, 2.0, "draining published")
    finally:
        await beater.stop()
        await registry.aclose()


async def test_registers_again_when_the_registry_forgot_it(registry: Registry) -> None:
    beater = Heartbeater(registry, INFO, lambda: LoadReport(ready=True), 0.1, 2.0)
    await beater.start()

    async def registered() -> bool:
        # The catalog can show the instance before register() has returned to us.
        return beater.registrations == 1 and await _is_listed(registry)

    await _until(registered, 3.0, "registered")

    await registry.deregister(INFO.id)  # what the reaper does to an expired instance

    async def back() -> bool:
        return beater.registrations == 2 and await _is_listed(registry)

    await _until(back, 3.0, "re-registered")
    await beater.stop()


async def _is_listed(registry: Registry) -> bool:
    return [s.info.id for s in await registry.instances()] == [INFO.id]


async def test_instance_reaped_between_slow_beats_comes_back(tmp_path: Path) -> None:
    registry = EmbeddedRegistry(tmp_path / "r.db", deregister_after_s=0.2)
    # Beats (1.0 s apart) are slower than TTL + reap (0.4 s): every beat finds it gone.
    beater = Heartbeater(registry, INFO, lambda: LoadReport(ready=True), 1.0, 0.2)
    await beater.start()
    try:

        async def reregistered() -> bool:
            return beater.registrations >= 2

        await _until(reregistered, 4.0, "re-registered after reaping")
        assert beater.failures == 0
    finally:
        await beater.stop()
        await registry.aclose()


async def test_backs_off_while_consul_is_down_and_recovers() -> None:
    port = free_port()  # nothing listens yet
    registry = ConsulRegistry(consul_settings(f"127.0.0.1:{port}"), environ={})
    beater = Heartbeater(
        registry, INFO, lambda: LoadReport(ready=True), 0.1, 2.0, max_backoff_s=0.4
    )
    await beater.start()
    try:
        await asyncio.sleep(1.5)
        # Failing fast against a closed port, backoff keeps the attempts few.
        assert 3 <= beater.failures <= 15
        assert not beater.registered
        assert beater._task is not None
        assert not beater._task.done()

        state = consul_datacenter()
        with UvicornThread(ConsulDouble(state).app(), port=port):

            async def recovered() -> bool:
                # The catalog can list the instance before register() has returned to us.
                return beater.registered and await _is_listed(registry)

            await _until(recovered, 5.0, "registered after recovery")
            await beater.stop()
            assert ("consul-double", "edge-eu-1") not in state.services
    finally:
        await beater.stop(deregister=False)
        await registry.aclose()


async def test_retries_while_sqlite_is_locked_by_another_writer(tmp_path: Path) -> None:
    path = tmp_path / "r.db"
    registry = EmbeddedRegistry(path, busy_timeout_s=0.1)
    beater = Heartbeater(
        registry, INFO, lambda: LoadReport(ready=True), 0.1, 5.0, max_backoff_s=0.2
    )
    await beater.start()
    await _until(lambda: _is_listed(registry), 3.0, "registered")

    other = sqlite3.connect(path, isolation_level=None)
    try:
        other.execute("BEGIN IMMEDIATE")  # another process hogs the write lock
        before = beater.failures

        async def failing() -> bool:
            return beater.failures >= before + 2

        await _until(failing, 5.0, "failing while locked")
        other.execute("COMMIT")
        beats = beater.beats

        async def beating() -> bool:
            return beater.beats > beats + 1

        await _until(beating, 5.0, "beating again")
    finally:
        other.close()
        await beater.stop()
        await registry.aclose()


async def test_a_failing_load_callback_does_not_kill_the_loop(tmp_path: Path) -> None:
    registry = EmbeddedRegistry(tmp_path / "r.db")
    calls = [0]

    def load() -> LoadReport:
        calls[0] += 1
        if calls[0] <= 2:
            raise RuntimeError("engine not ready to report")
        return LoadReport(ready=True)

    beater = Heartbeater(registry, INFO, load, 0.05, 2.0, max_backoff_s=0.1)
    await beater.start()
    try:

        async def beating() -> bool:
            return beater.beats >= 1

        await _until(beating, 3.0, "beating after callback errors")
        assert beater.failures == 2
    finally:
        await beater.stop()
        await registry.aclose()
