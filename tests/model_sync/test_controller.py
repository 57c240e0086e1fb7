from __future__ import annotations

from collections import Counter
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import anyio
import httpx
import pytest

from hybrid_llm.local.servers import UvicornThread
from model_sync import keys, ops
from model_sync.controller import Controller
from model_sync.gates import PrometheusGate
from model_sync.plan import build_plan
from model_sync.records import FeedbackCounts, GateSettings
from model_sync.store import ConflictError
from servekit.registry.protocol import Registry
from tests.model_sync.fleet import Fleet, actions, wait_history, wait_state
from tests.model_sync.test_agent import wait_actual

pytestmark = pytest.mark.anyio

GATES = GateSettings(min_requests=10, max_error_rate=0.05, max_error_rate_increase=0.02)


@asynccontextmanager
async def controlling(registry: Registry, holder: str = "c1") -> AsyncIterator[Controller]:
    controller = Controller(registry, holder=holder, tick_s=0.03, lock_ttl_s=0.5)
    async with anyio.create_task_group() as tg:
        tg.start_soon(controller.run)
        try:
            yield controller
        finally:
            tg.cancel_scope.cancel()


async def start(
    fleet: Fleet, version: str, bake_s: float = 0.3, gates: GateSettings = GATES, **kw: str
) -> str:
    plan = await build_plan(
        fleet.registry,
        fleet.store,
        "tiny",
        version,
        canary=kw.get("canary", "1"),
        waves=kw.get("waves", "by-region"),
        bake_s=bake_s,
        gates=gates,
        converge_timeout_s=10,
    )
    await ops.start_rollout(fleet.store, plan)
    return plan.id


def new_fleet(registry: Registry, tmp_path: Path, **behaviour: object) -> Fleet:
    defaults: dict[str, object] = {"error_rate": {}, "ttft_ms": {}, "broken": set()}
    return Fleet(registry, tmp_path, **(defaults | behaviour))


async def test_full_rollout_canary_then_regions(tmp_path: Path, registry: Registry) -> None:
    fleet = new_fleet(registry, tmp_path)
    await fleet.publish("v2")
    async with fleet.running(), controlling(fleet.registry):
        await start(fleet, "v2")
        state = await wait_state(fleet.store, "tiny", lambda s: not s.active)
        await wait_history(fleet.store, "tiny", "rollout-completed")
    assert state.status == "completed"
    assert fleet.versions() == dict.fromkeys(fleet.versions(), "v2")
    assert (await fleet.store.traffic("tiny")).shares == {"v2": 1.0}
    assert await fleet.store.aliases("tiny") == {"canary": "v2", "stable": "v2", "previous": "v1"}
    history = actions(await fleet.store.history("tiny"))
    assert history == [
        "push",
        "rollout-started:canary (1) → region a (1) → region b (2)",
        "wave-started:canary",
        "wave-serving:canary",
        "gate-passed:canary",
        "wave-started:region a",
        "wave-serving:region a",
        "gate-passed:region a",
        "wave-started:region b",
        "wave-serving:region b",
        "gate-passed:region b",
        "rollout-completed:v2 is stable",
    ]
    # Plan: canary is the first node of the first region, then the rest of a, then b.
    plan = await fleet.store.plan("tiny")
    assert plan is not None
    assert [w.nodes for w in plan.waves] == [
        ["edge-a1"],
        ["edge-a2"],
        ["edge-b1", "edge-b2"],
    ]


async def test_bad_version_fails_gate_and_rolls_back(tmp_path: Path, registry: Registry) -> None:
    fleet = new_fleet(registry, tmp_path, error_rate={"v3": 0.3})
    await fleet.publish("v2", "v3")
    async with fleet.running(), controlling(fleet.registry):
        await start(fleet, "v2", bake_s=0.2)
        await wait_state(fleet.store, "tiny", lambda s: s.status == "completed")
        await start(fleet, "v3", bake_s=0.3)
        state = await wait_state(fleet.store, "tiny", lambda s: not s.active)
    assert state.status == "rolled_back"
    assert state.reason.startswith("gate failed after canary: error rate")
    assert state.last_gate["verdict"] == "fail"
    assert fleet.versions() == dict.fromkeys(fleet.versions(), "v2")
    # Only the canary ever took v3, and it went straight back to the kept v2.
    assert [n.swaps for n in fleet.nodes] == [["v2", "v3", "v2"], ["v2"], ["v2"], ["v2"]]
    assert (await fleet.store.traffic("tiny")).shares == {"v2": 1.0}
    assert await fleet.store.alias("tiny", "stable") == "v2"
    tail = actions(await fleet.store.history("tiny"))[-4:]
    assert tail == [
        "gate-failed:canary",
        "auto-abort:gate failed after canary",
        "rollback-started:gate failed after canary",
        "rolled-back:back on v2",
    ]


async def test_version_that_fails_to_load_is_rolled_back(
    tmp_path: Path, registry: Registry
) -> None:
    fleet = new_fleet(registry, tmp_path, broken={"v3"})
    await fleet.publish("v3")
    async with fleet.running(), controlling(fleet.registry):
        await start(fleet, "v3", bake_s=0.1)
        state = await wait_state(fleet.store, "tiny", lambda s: not s.active)
    assert state.status == "rolled_back"
    assert "edge-a1: RuntimeError: llama_model_load: invalid magic" in state.reason
    assert fleet.versions() == dict.fromkeys(fleet.versions(), "v1")
    assert all(n.swaps == [] for n in fleet.nodes)
    actual = await fleet.store.actual("edge-a1")
    assert actual is not None
    assert actual.state == "serving"
    assert actual.version == "v1"


async def test_controller_restart_mid_rollout_continues(tmp_path: Path, registry: Registry) -> None:
    fleet = new_fleet(registry, tmp_path)
    await fleet.publish("v2")
    async with fleet.running():
        async with controlling(fleet.registry, "first"):
            await start(fleet, "v2", bake_s=0.4)
            # Die while region a bakes.
            await wait_state(fleet.store, "tiny", lambda s: s.wave == 1 and s.step == "bake")
        mid = await fleet.store.state("tiny")
        assert mid is not None
        assert mid.status == "running"
        assert fleet.versions() == {
            "edge-a1": "v2",
            "edge-a2": "v2",
            "edge-b1": "v1",
            "edge-b2": "v1",
        }
        async with controlling(fleet.registry, "second"):
            state = await wait_state(fleet.store, "tiny", lambda s: not s.active)
    assert state.status == "completed"
    history = await fleet.store.history("tiny")
    counts = Counter(actions(history))
    assert all(c == 1 for c in counts.values()), counts
    assert counts["wave-started:region a"] == 1
    actors = {e.actor for e in history if e.action.startswith(("wave", "gate"))}
    assert actors == {"controller:first", "controller:second"}
    # The second controller continued region a's bake; it did not start the wave again.
    a_started = next(e for e in history if e.action == "wave-started" and "a2" in str(e.nodes))
    assert a_started.actor == "controller:first"


async def test_only_the_lock_holder_drives(tmp_path: Path, registry: Registry) -> None:
    fleet = new_fleet(registry, tmp_path)
    await fleet.publish("v2")
    async with (
        fleet.running(),
        controlling(fleet.registry, "one"),
        controlling(fleet.registry, "two"),
    ):
        await start(fleet, "v2", bake_s=0.3)
        await wait_state(fleet.store, "tiny", lambda s: not s.active)
        await wait_history(fleet.store, "tiny", "rollout-completed")
    actors = {e.actor for e in await fleet.store.history("tiny") if e.action.startswith("wave")}
    # Whichever took the lock first drove every wave; the other never acted.
    assert len(actors) == 1
    assert actors <= {"controller:one", "controller:two"}


async def test_one_rollout_at_a_time(tmp_path: Path, registry: Registry) -> None:
    fleet = new_fleet(registry, tmp_path)
    await fleet.publish("v2", "v3")
    async with fleet.running():
        await start(fleet, "v2")
        with pytest.raises(ConflictError, match="rollout of tiny to v2 is running"):
            await start(fleet, "v3")


async def test_inconclusive_gate_pauses_then_promote_continues(
    tmp_path: Path, registry: Registry
) -> None:
    fleet = new_fleet(registry, tmp_path)
    await fleet.publish("v2")
    async with fleet.running(), controlling(fleet.registry):
        # Far more requests wanted than a short bake sees.
        await start(fleet, "v2", bake_s=0.1, gates=GateSettings(min_requests=10**6))
        paused = await wait_state(fleet.store, "tiny", lambda s: s.status == "paused")
        assert paused.reason.startswith("gate inconclusive: only")
        assert paused.wave == 0
        await ops.promote(fleet.store, "tiny", full=True)
        state = await wait_state(fleet.store, "tiny", lambda s: not s.active)
    assert state.status == "completed"
    assert "promote:all remaining waves" in actions(await fleet.store.history("tiny"))


async def test_operator_abort_and_fleet_rollback(tmp_path: Path, registry: Registry) -> None:
    fleet = new_fleet(registry, tmp_path)
    await fleet.publish("v1", "v2", "v3")
    async with fleet.running(), controlling(fleet.registry):
        await start(fleet, "v2", bake_s=0.3)
        await wait_state(fleet.store, "tiny", lambda s: s.status == "completed")
        await start(fleet, "v3", bake_s=30)
        await wait_state(fleet.store, "tiny", lambda s: s.step == "bake")
        await ops.abort(fleet.store, "tiny", "looks wrong")
        state = await wait_state(fleet.store, "tiny", lambda s: not s.active)
        assert state.status == "aborted"
        assert fleet.versions() == dict.fromkeys(fleet.versions(), "v2")
        # After the fact: the whole fleet back to the previous stable in one command.
        assert await ops.rollback(fleet.store, "tiny") == "v1"
        for node in fleet.nodes:
            await wait_actual(fleet.store, node.info.id, lambda a: a.version == "v1")
    assert await fleet.store.alias("tiny", "stable") == "v1"
    assert (await fleet.store.traffic("tiny")).shares == {"v1": 1.0}
    entries = await fleet.store.history("tiny")
    assert [e.actor for e in entries if e.action in ("abort", "rollback")] == ["alice", "alice"]


async def test_prometheus_figures_drive_the_gate(tmp_path: Path, registry: Registry) -> None:
    from tests.model_sync.test_plan_gates import _prometheus_double

    seen: list[str] = []
    # The registry's counters look perfect; Prometheus says v2 fails 20 %.
    app = _prometheus_double({'"v2"}[': 0.2, '"v1"}[': 0.0}, seen)
    fleet = new_fleet(registry, tmp_path)
    await fleet.publish("v1", "v2")
    with UvicornThread(app) as server:
        async with httpx.AsyncClient() as client, fleet.running():
            gate = PrometheusGate(
                server.url,
                'err{version="$version"}[$window]',
                'ttft{version="$version"}[$window]',
                client,
            )
            controller = Controller(fleet.registry, tick_s=0.03, prometheus=gate)
            async with anyio.create_task_group() as tg:
                tg.start_soon(controller.run)
                await start(fleet, "v2", bake_s=0.1)
                state = await wait_state(fleet.store, "tiny", lambda s: not s.active)
                tg.cancel_scope.cancel()
    assert state.status == "rolled_back"
    assert state.last_gate["source"] == "prometheus"
    assert state.last_gate["new_error_rate"] == 0.2
    assert 'err{version="v2"}[1s]' in seen
    assert fleet.versions() == dict.fromkeys(fleet.versions(), "v1")


async def test_worse_user_feedback_on_the_canary_rolls_it_back(
    tmp_path: Path, registry: Registry
) -> None:
    """Faster and error-free, yet users accept fewer of its answers: the acceptance
    gate fails the canary (routers' counts scripted into the KV store)."""
    fleet = new_fleet(registry, tmp_path)
    await fleet.publish("v2", "v3")
    gates = GATES.model_copy(update={"min_feedback": 20, "max_acceptance_drop": 0.1})
    reports = {
        ("v2", "router-1"): FeedbackCounts(rated=30, accepted=26),
        ("v2", "router-2"): FeedbackCounts(rated=20, accepted=17),
        ("v3", "router-1"): FeedbackCounts(rated=25, accepted=14),
    }
    for (version, router), counts in reports.items():
        await fleet.store.put(keys.feedback_key("tiny", version, router), counts)
    assert (await fleet.store.feedback("tiny", "v2")).rated == 50
    async with fleet.running(), controlling(fleet.registry):
        await start(fleet, "v2", bake_s=0.2)
        await wait_state(fleet.store, "tiny", lambda s: s.status == "completed")
        await start(fleet, "v3", bake_s=0.3, gates=gates)
        state = await wait_state(fleet.store, "tiny", lambda s: not s.active)
    assert state.status == "rolled_back"
    assert state.reason.startswith("gate failed after canary: answer acceptance 56.0% vs 86.0%")
    assert state.last_gate["new_acceptance"] == 0.56
    assert fleet.versions() == dict.fromkeys(fleet.versions(), "v2")


async def test_too_little_feedback_leaves_the_acceptance_gate_out(
    tmp_path: Path, registry: Registry
) -> None:
    fleet = new_fleet(registry, tmp_path)
    await fleet.publish("v2", "v3")
    await fleet.store.put(
        keys.feedback_key("tiny", "v2", "r"), FeedbackCounts(rated=50, accepted=45)
    )
    await fleet.store.put(keys.feedback_key("tiny", "v3", "r"), FeedbackCounts(rated=5, accepted=0))
    async with fleet.running(), controlling(fleet.registry):
        await start(fleet, "v2", bake_s=0.2)
        await wait_state(fleet.store, "tiny", lambda s: s.status == "completed")
        await start(fleet, "v3", bake_s=0.2)
        state = await wait_state(fleet.store, "tiny", lambda s: not s.active)
    assert state.status == "completed"
    assert state.last_gate["new_feedback"] == 5
