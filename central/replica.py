"""One replica as the gateway sees it: process, health, load, and its engine.

:meth:`Replica.run` is the replica's supervision loop. It launches the process
(for launched kinds), waits for the engine's health endpoint, then scrapes its
load every ``scrape_interval_s`` and probes health every
``health_interval_s``. A replica leaves the rotation after
``unhealthy_after`` failed probes, at once when its process exits or a
request could not reach it, and comes back as soon as it answers again. A
dead process is restarted after an exponential backoff.

A launched vLLM replica reports what its prefix cache holds
(:mod:`servekit.engine.vllm_prefixes`): its requests go through the report,
which subscribes to the server's KV-cache events, and :meth:`Replica.report`
carries the names; a restart empties it.
"""

from __future__ import annotations

import asyncio
import dataclasses
import enum
import logging
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from central.balancer import Candidate
from central.commands import Endpoint, LaunchPlan, build_plan, endpoint_for_url, llama_settings
from central.scrape import ReplicaLoad, ReplicaProbe
from central.settings import SupervisionSettings
from central.specs import LlamaCppReplica, UrlReplica, VllmReplica
from central.specs import ReplicaSpec as AnySpec
from servekit.engine.llama import LlamaCppEngine
from servekit.engine.process import Backoff, EngineProcess, ProcessSupervisor, free_port
from servekit.engine.protocol import Engine, LoadReport
from servekit.engine.rates import RateTracker
from servekit.engine.vllm_prefixes import (
    PrefixReportingEngine,
    VllmPrefixReport,
    prefix_report_for,
)
from servekit.secrets import redact_url
from servekit.tracing import EngineTraces

__all__ = ["EngineFactory", "Replica", "ReplicaState"]

log = logging.getLogger(__name__)

EngineFactory = Callable[[Endpoint], Engine]


class ReplicaState(enum.StrEnum):
    STARTING = "starting"
    HEALTHY = "healthy"
    UNHEALTHY = "unhealthy"
    RESTARTING = "restarting"
    STOPPED = "stopped"


class Replica:
    """A replica's supervision state and the engine that talks to it."""

    def __init__(
        self,
        spec: AnySpec,
        *,
        model_name: str,
        version: str = "",
        supervision: SupervisionSettings,
        probe: ReplicaProbe,
        engine_factory: EngineFactory,
        on_change: Callable[[], None] = lambda: None,
        token: str | None = None,
        traces: EngineTraces | None = None,
    ) -> None:
        self.spec = spec
        self.name = spec.name
        self._sup = supervision
        self._probe = probe
        self.process: EngineProcess | None = None
        self.plan: LaunchPlan | None = None
        self._supervisor: ProcessSupervisor | None = None
        self._local: Engine | None = None
        self._local_start: asyncio.Task[None] | None = None
        self.prefixes: VllmPrefixReport | None = None
        if isinstance(spec, UrlReplica):
            self.endpoint = endpoint_for_url(spec, model_name=model_name)
        elif isinstance(spec, LlamaCppReplica) and spec.mode == "inprocess":
            self.endpoint = Endpoint(f"inprocess://{spec.name}", model_name, 1, "none", "")
            self._local = LlamaCppEngine(
                llama_settings(spec, model_name=model_name), version=version
            )
        else:
            port = spec.port or free_port(spec.host)
            run_dir = Path(supervision.log_dir)
            if isinstance(spec, VllmReplica):
                self.prefixes = prefix_report_for(spec, f"{spec.name}-{port}")
            plan = build_plan(
                spec, port=port, model_name=model_name, run_dir=run_dir, version=version,
                token=token, traces=traces,
                kv_events=self.prefixes.argv if self.prefixes else (),
            )  # fmt: skip
            self.endpoint = plan.endpoint
            self.plan = plan
            self.process = EngineProcess(
                spec.name,
                plan.command,
                run_dir / f"{spec.name}.log",
                ports=(port,),
                pass_env=supervision.pass_env,
            )
            self._supervisor = ProcessSupervisor(self.process, supervision)
        self.engine = self._local or engine_factory(self.endpoint)
        if self.prefixes is not None:
            self.engine = PrefixReportingEngine(self.engine, self.prefixes)
        self.state = ReplicaState.STARTING
        self.inflight = 0
        self.served = 0
        self.load: ReplicaLoad | None = None
        self.rates = RateTracker()  # what this gateway measured on the requests it sent
        self._inflight_at_scrape = 0
        self._local_restarts = 0
        self._scraped = 0.0
        self._failures = 0
        self._refused_until = 0.0
        self._last_health = 0.0
        self._started = time.monotonic()
        self._backoff = Backoff(
            supervision.restart_backoff_initial_s,
            supervision.restart_backoff_max_s,
            supervision.stable_after_s,
        )
        self._on_change = on_change

    @property
    def capacity(self) -> int:
        return self.endpoint.capacity

    @property
    def restarts(self) -> int:
        return self._supervisor.restarts if self._supervisor else self._local_restarts

    @property
    def last_exit(self) -> int | None:
        return self._supervisor.last_exit if self._supervisor else None

    @property
    def healthy(self) -> bool:
        return self.state is ReplicaState.HEALTHY

    def report(self) -> LoadReport:
        """The replica's speeds: its own load report where its engine gives one (an
        edge agent as a stand-in), else what the gateway measured on the requests
        it sent it (vLLM's and TensorRT-LLM's metrics carry no TTFT or rates)."""
        if self.load is not None and self.load.report is not None:
            return self.load.report
        if self.prefixes is not None:
            return dataclasses.replace(self.rates.report(), **self.prefixes.report())
        return self.rates.report()

    def candidate(self) -> Candidate:
        load = self.load or ReplicaLoad()
        # The engine's count includes our own requests as of the scrape; what
        # it reported beyond those is other clients' traffic.
        external = max(0, load.running + load.waiting - self._inflight_at_scrape)
        return Candidate(
            name=self.name,
            capacity=self.capacity,
            inflight=self.inflight,
            external=external,
            kv_cache_usage=load.kv_cache_usage,
            refused=time.monotonic() < self._refused_until,
        )

    def refused(self, backoff_s: float) -> None:
        """It answered 429: busy, not broken. It ranks last for ``backoff_s``."""
        self._refused_until = max(self._refused_until, time.monotonic() + backoff_s)

    def mark_unreachable(self, reason: str) -> None:
        """A request could not reach the replica: take it out of rotation now."""
        if self.state is ReplicaState.HEALTHY:
            log.warning("replica %s unreachable (%s); out of rotation", self.name, reason)
            self._set(ReplicaState.UNHEALTHY)
        self._failures = max(self._failures, self._sup.unhealthy_after)

    async def run(self) -> None:
        """Supervise until cancelled."""
        if self.prefixes is not None:
            self.prefixes.start()  # connects before the server binds
        if self.process is not None:
            await self._launch()
        elif self._local is not None:
            self._local_start = asyncio.create_task(self._local.start())
        while True:
            await self._tick()
            healthy = self.state is ReplicaState.HEALTHY
            interval = self._sup.scrape_interval_s if healthy else self._sup.health_interval_s
            await asyncio.sleep(interval)

    async def stop(self) -> None:
        self._set(ReplicaState.STOPPED)
        if self._supervisor is not None:
            await self._supervisor.stop()
        if self.prefixes is not None:
            await self.prefixes.aclose()
        if self._local_start is not None:
            self._local_start.cancel()
            await asyncio.gather(self._local_start, return_exceptions=True)

    def status(self) -> dict[str, Any]:
        load = self.load
        return {
            "name": self.name,
            "kind": self.spec.kind,
            "url": redact_url(self.endpoint.base_url),
            "state": self.state.value,
            "pid": self.process.pid if self.process is not None else None,
            "restarts": self.restarts,
            "last_exit": self.last_exit,
            "capacity": self.capacity,
            "inflight": self.inflight,
            "served": self.served,
            "engine_running": load.running if load else None,
            "engine_waiting": load.waiting if load else None,
            "kv_cache_usage": load.kv_cache_usage if load else None,
            "gpus": list(getattr(self.spec, "gpus", [])),
            "command": self.plan.shell() if self.plan is not None else None,
            "log": str(self.process.log_path) if self.process is not None else None,
            **(self.prefixes.status() if self.prefixes is not None else {}),
        }

    # -- internals ---------------------------------------------------------

    def _set(self, state: ReplicaState) -> None:
        if state is not self.state:
            self.state = state
            self._on_change()

    async def _launch(self) -> None:
        assert self._supervisor is not None
        self._set(ReplicaState.STARTING)
        self._failures = 0
        self.load = None
        await self._supervisor.launch()
        self._started = time.monotonic()

    async def _tick(self) -> None:
        sup = self._supervisor
        if sup is not None and not sup.process.alive:
            await self._restart(sup)
            return
        if self._local_start is not None and self._local_start.done():
            await self._local_failed(self._local_start)
        if self.state is ReplicaState.STARTING:
            if await self._healthy_now():
                waited = time.monotonic() - self._started
                log.info("replica %s healthy after %.1fs", self.name, waited)
                self._failures = 0
                self._set(ReplicaState.HEALTHY)
                await self._scrape()
            elif sup is not None and sup.startup_overdue():
                log.error("replica %s not healthy after %.0fs; restarting", self.name,
                          self._sup.startup_timeout_s)  # fmt: skip
                await sup.stop()
            return
        ok = await self._scrape()
        now = time.monotonic()
        if not ok or now - self._last_health >= self._sup.health_interval_s:
            self._last_health = now
            ok = await self._healthy_now()
        if ok:
            if self.state is not ReplicaState.HEALTHY:
                log.info("replica %s healthy again; back in rotation", self.name)
            self._failures = 0
            self._set(ReplicaState.HEALTHY)
        else:
            self._failures += 1
            if self._failures >= self._sup.unhealthy_after and self.healthy:
                log.warning("replica %s failed %d probes; out of rotation", self.name,
                            self._failures)  # fmt: skip
                self._set(ReplicaState.UNHEALTHY)

    async def _healthy_now(self) -> bool:
        if self._local is not None:
            return await self._local.ready()
        return await self._probe.healthy(self.endpoint)

    async def _read_load(self) -> ReplicaLoad | None:
        if self._local is not None:
            return ReplicaLoad.of(self._local.load())
        return await self._probe.load(self.endpoint)

    async def _local_failed(self, task: asyncio.Task[None]) -> None:
        """The in-process engine's start finished; if it failed, retry after a backoff."""
        error = None if task.cancelled() else task.exception()
        if error is None or self._local is None:
            return
        delay = self._backoff.delay(0.0)
        log.error("replica %s failed to load (%s); retrying in %.1fs", self.name, error, delay)
        self._set(ReplicaState.RESTARTING)
        await asyncio.sleep(delay)
        self._local_restarts += 1
        self._set(ReplicaState.STARTING)
        self._local_start = asyncio.create_task(self._local.start())

    async def _scrape(self) -> bool:
        if self.endpoint.load_source == "none" and self._local is None:
            return True
        every = self.endpoint.load_interval_s
        if every is not None and self.load is not None and time.monotonic() - self._scraped < every:
            return True
        self._scraped = time.monotonic()
        inflight = self.inflight
        load = await self._read_load()
        if load is None:
            return False
        self.load = load
        # Requests of ours that started or ended while the scrape was on the
        # wire may or may not be in its count: assume they are, so our own
        # traffic is never counted twice as someone else's.
        self._inflight_at_scrape = max(inflight, self.inflight)
        report = load.report
        return report is None or (report.ready and not report.draining)

    async def _restart(self, sup: ProcessSupervisor) -> None:
        uptime = sup.process.uptime_s
        delay = sup.next_delay()
        log.warning("replica %s exited (code %s) after %.1fs; restarting in %.1fs",
                    self.name, sup.last_exit, uptime, delay)  # fmt: skip
        self._set(ReplicaState.RESTARTING)
        self.load = None
        if self.prefixes is not None:
            self.prefixes.reset()  # the new server starts with an empty cache
        # Whatever the dead leader left in its session (engine workers) goes first.
        await sup.stop()
        await sup.relaunch(delay)
        self._set(ReplicaState.STARTING)
        self._failures = 0
        self._started = time.monotonic()
