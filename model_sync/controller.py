"""The rollout controller: advances the one active rollout, wave by wave.

For each wave: ``apply`` (set the wave's nodes' desired version) →
``converge`` (wait until they serve it; a node that fails to load aborts the
rollout) → ``bake`` (let traffic flow; the router's shares follow the nodes
on each version) → ``gate`` (compare with the replaced version, see
:mod:`model_sync.gates`): pass moves to the next wave, fail rolls every
touched node back, inconclusive pauses for an operator.

Crash safety: each step's side effects are idempotent and the state document
is rewritten by compare-and-swap after every step, carrying the history
entries of that step in an outbox that is flushed under fixed keys. A
controller killed anywhere redoes at most one idempotent step and writes no
history twice. Bake clocks are wall-clock times in the state, so a restart
continues a bake instead of starting it again. Only the holder of the
``locks/rollout`` lease acts, so two controllers never both drive.
"""

from __future__ import annotations

import contextlib
import logging
import os
import socket
import time

import anyio

from model_sync import keys
from model_sync.gates import (
    GateResult,
    GateUnavailable,
    PrometheusGate,
    acceptance,
    evaluate,
    judge,
)
from model_sync.gates import read_counters as read_node_counters
from model_sync.records import ActiveRollout, NodeCounters, RolloutPlan, RolloutState
from model_sync.store import SyncStore
from servekit.registry.protocol import LockHandle, Registry, RegistryError

__all__ = ["Controller"]

log = logging.getLogger(__name__)

_MAX_STEPS_PER_TICK = 8


class Controller:
    """Drive rollouts stored in ``registry``; run :meth:`run` as a long-lived task."""

    def __init__(
        self,
        registry: Registry,
        *,
        holder: str | None = None,
        tick_s: float = 1.0,
        lock_ttl_s: float = 15.0,
        prometheus: PrometheusGate | None = None,
    ) -> None:
        self.registry = registry
        self.holder = holder or f"{socket.gethostname()}:{os.getpid()}"
        self.store = SyncStore(registry, actor=f"controller:{self.holder}")
        self.tick_s = tick_s
        self.lock_ttl_s = lock_ttl_s
        self.prometheus = prometheus

    async def run(self) -> None:
        """Take the rollout lock (waiting while another controller holds it) and lead."""
        while True:
            try:
                lock = await self.registry.acquire_lock(
                    keys.ROLLOUT_LOCK, self.holder, self.lock_ttl_s
                )
            except RegistryError as exc:
                log.warning("registry unavailable: %s", exc)
                lock = None
            if lock is None:
                await anyio.sleep(self.tick_s)
                continue
            log.info("controller %s holds %s", self.holder, keys.ROLLOUT_LOCK)
            try:
                await self._lead(lock)
            finally:
                # On any exit; if the registry is gone the lease expires by itself.
                with anyio.CancelScope(shield=True), contextlib.suppress(RegistryError):
                    await self.registry.release_lock(lock)

    async def _lead(self, lock: LockHandle) -> None:
        while True:
            try:
                if not await self.registry.renew_lock(lock):
                    log.warning("lost %s; standing by", keys.ROLLOUT_LOCK)
                    return
                await self.tick()
            except RegistryError as exc:
                log.warning("registry unavailable: %s", exc)
            await anyio.sleep(self.tick_s)

    async def tick(self) -> RolloutState | None:
        """Advance the active rollout as far as it can go right now."""
        marker = await self.store.get(keys.ACTIVE_ROLLOUT, ActiveRollout)
        if marker is None:
            return None
        return await self.advance(marker.model)

    async def advance(self, model: str) -> RolloutState | None:
        state: RolloutState | None = None
        for _ in range(_MAX_STEPS_PER_TICK):
            key = keys.rollout_state_key(model)
            found = await self.store.read(key, RolloutState)
            plan = await self.store.plan(model)
            if found is None or plan is None or plan.id != found[0].rollout_id:
                return None
            state, index = found
            if state.outbox:
                await self._flush(key, state, index)
                continue
            new = await self._step(plan, state)
            if new is None:
                return state
            new.updated_at = time.time()
            if not await self.store.kv.put_if(key, new.dump(), index):
                return state  # an operator steered it meanwhile: re-read next tick
        return state

    async def _flush(self, key: str, state: RolloutState, index: int) -> None:
        for entry in state.outbox:
            await self.store.write_history(entry)
            log.info("%s %s: %s %s", entry.model, entry.version, entry.action, entry.detail)
        state.outbox = []
        await self.store.kv.put_if(key, state.dump(), index)

    async def _step(self, plan: RolloutPlan, state: RolloutState) -> RolloutState | None:
        if state.status == "running":
            return await self._forward(plan, state.model_copy(deep=True))
        if state.status == "rolling_back":
            return await self._backward(plan, state.model_copy(deep=True))
        return None

    # -- going forward -----------------------------------------------------

    async def _forward(self, plan: RolloutPlan, s: RolloutState) -> RolloutState | None:
        wave = plan.waves[s.wave]
        now = time.time()
        if s.step == "apply":
            if not s.baseline:
                s.baseline = await self._counters(plan)
            for node in wave.nodes:
                await self.store.set_desired(node, plan.model, plan.version)
            s.touched = sorted(set(s.touched) | set(wave.nodes))
            s.step, s.step_started_at = "converge", now
            self._log(s, "wave-started", wave.name, wave.nodes)
            return s
        if s.step == "converge":
            failed, waiting = [], []
            for node in wave.nodes:
                actual = await self.store.actual(node)
                # A failure reported before this wave was applied is an old attempt's.
                if (
                    actual
                    and actual.state == "failed"
                    and actual.target == plan.version
                    and actual.updated_at >= s.step_started_at
                ):
                    failed.append(f"{node}: {actual.error}")
                elif not (actual and actual.state == "serving" and actual.version == plan.version):
                    waiting.append(node)
            if failed:
                return self._roll_back(s, "node failed to take the version: " + "; ".join(failed))
            if waiting:
                if now - s.step_started_at > plan.converge_timeout_s:
                    return self._roll_back(
                        s,
                        f"{', '.join(waiting)} not serving {plan.version} after "
                        f"{plan.converge_timeout_s:.0f}s",
                    )
                return None
            share = len(s.touched) / max(1, len({n for w in plan.waves for n in w.nodes}))
            await self.store.set_traffic(
                plan.model, {plan.version: share, plan.from_version: 1.0 - share}
            )
            s.bake_snapshot = await self._counters(plan)
            s.step, s.step_started_at = "bake", now
            self._log(s, "wave-serving", f"{wave.name}; traffic {share:.0%}", wave.nodes)
            return s
        if s.step == "bake":
            if s.force_pass or s.skip_gates or now - s.step_started_at >= wave.bake_s:
                s.step = "gate"
                return s
            return None
        # gate
        if s.force_pass or s.skip_gates:
            result = GateResult("pass", [f"promoted by operator ({s.reason or 'promote'})"])
            s.force_pass = False
        else:
            result = await self._judge(plan, s, now - s.step_started_at)
        s.last_gate = dict(result.figures) | {"verdict": result.verdict}
        if result.verdict == "fail":
            self._log(s, "gate-failed", f"{wave.name}: {result.summary()}")
            return self._roll_back(s, f"gate failed after {wave.name}: {result.summary()}")
        if result.verdict == "inconclusive":
            s.status, s.reason = "paused", f"gate inconclusive: {result.summary()}"
            self._log(s, "gate-inconclusive", f"{wave.name}: {result.summary()}")
            return s
        self._log(s, "gate-passed", f"{wave.name}: {result.summary()}")
        if s.wave + 1 < len(plan.waves):
            s.wave, s.step, s.step_started_at = s.wave + 1, "apply", now
            return s
        await self.store.set_traffic(plan.model, {plan.version: 1.0})
        await self.store.set_alias(plan.model, "stable", plan.version)
        if plan.from_version and plan.from_version != plan.version:
            await self.store.set_alias(plan.model, "previous", plan.from_version)
        s.status, s.reason = "completed", ""
        self._log(s, "rollout-completed", f"{plan.version} is stable", s.touched)
        return s

    async def _judge(self, plan: RolloutPlan, s: RolloutState, window_s: float) -> GateResult:
        result = await self._judge_serving(plan, s, window_s)
        if result.verdict == "inconclusive" or not plan.from_version:
            return result
        new = await self.store.feedback(plan.model, plan.version)
        old = await self.store.feedback(plan.model, plan.from_version)
        return acceptance(plan.gates, result, new, old)

    async def _judge_serving(
        self, plan: RolloutPlan, s: RolloutState, window_s: float
    ) -> GateResult:
        if self.prometheus is not None:
            try:
                new_rate, new_p95 = await self.prometheus.figures(
                    plan.model, plan.version, window_s
                )
                old_rate, old_p95 = await self.prometheus.figures(
                    plan.model, plan.from_version, window_s
                )
            except GateUnavailable as exc:
                return GateResult("inconclusive", [str(exc)])
            if new_rate is None:
                return GateResult("inconclusive", ["prometheus has no samples for the new version"])
            figures: dict[str, float | int | str | None] = {
                "new_error_rate": new_rate,
                "old_error_rate": old_rate,
                "new_ttft_p95_ms": new_p95,
                "old_ttft_p95_ms": old_p95,
                "source": "prometheus",
            }
            return judge(plan.gates, new_rate, old_rate or 0.0, new_p95, old_p95, figures)
        all_nodes = {n for w in plan.waves for n in w.nodes}
        return evaluate(
            plan.gates,
            new_nodes=s.touched,
            old_nodes=sorted(all_nodes - set(s.touched)),
            start=s.bake_snapshot,
            end=await self._counters(plan),
            baseline=s.baseline,
        )

    # -- rolling back ------------------------------------------------------

    def _roll_back(self, s: RolloutState, reason: str) -> RolloutState:
        s.status, s.step, s.step_started_at = "rolling_back", "apply", time.time()
        s.rollback_status, s.reason = "rolled_back", reason
        self._log(s, "auto-abort", reason)
        return s

    async def _backward(self, plan: RolloutPlan, s: RolloutState) -> RolloutState | None:
        nodes = sorted({n for w in plan.waves for n in w.nodes})
        if s.step == "apply":
            # Every plan node still meant for the new version goes back, touched or
            # not: a wave applied just before an operator's abort counts too.
            sent = []
            for node in nodes:
                desired = await self.store.desired(node)
                if desired is None or desired.version == plan.version:
                    back = plan.previous.get(node) or plan.from_version
                    await self.store.set_desired(node, plan.model, back)
                    sent.append(node)
            await self.store.set_traffic(plan.model, {plan.from_version: 1.0})
            await self.store.kv.delete(keys.alias_key(plan.model, "canary"))
            s.touched = sorted(set(s.touched) | set(sent))
            s.step, s.step_started_at = "converge", time.time()
            self._log(s, "rollback-started", s.reason, sent)
            return s
        pending = []
        for node in s.touched:
            back = plan.previous.get(node) or plan.from_version
            actual = await self.store.actual(node)
            if actual is None or actual.version != back or actual.state != "serving":
                pending.append(node)
        timed_out = time.time() - s.step_started_at > plan.converge_timeout_s
        if pending and not timed_out:
            return None
        s.status = s.rollback_status
        detail = f"back on {plan.from_version}"
        if pending:
            detail += f"; not confirmed by {', '.join(pending)}"
        self._log(s, s.rollback_status.replace("_", "-"), detail, s.touched)
        return s

    # -- helpers -----------------------------------------------------------

    async def _counters(self, plan: RolloutPlan) -> dict[str, NodeCounters]:
        nodes = {n for w in plan.waves for n in w.nodes}
        return await read_node_counters(self.registry, self.store, nodes)

    def _log(
        self, s: RolloutState, action: str, detail: str = "", nodes: list[str] | None = None
    ) -> None:
        s.outbox.append(
            self.store.entry(
                action,
                model=s.model,
                version=s.version,
                rollout_id=s.rollout_id,
                detail=detail,
                nodes=nodes or [],
            )
        )
