"""Live load for registry-discovered instances: each one's own ``/load``, polled.

The catalog says who exists, whether they are alive and who they are. It is
not where the router takes load figures from: a Consul agent forwards a
heartbeat that changes only a check's output after up to 1.5x its
``check_update_interval`` (2.5-7.5 min by default), so catalog figures can be
minutes old, and a new instance shows none. Instead, every poll interval the
router asks each listed instance for its ``/load`` (the same report its
heartbeats carry, and what the static-upstream path polls) and routes on that.

What :meth:`LiveLoad.snapshot` lists, per catalog entry:

* polled: the report (``last_heartbeat`` = when it was asked) and the
  router's round trip to it (``rtt_ms``: the minimum over its recent polls,
  each timed inside the concurrency limit so a round's queueing is not
  counted, :class:`servekit.rtt.MeasuredRtt`); healthy only while the
  catalog says alive *and* the report says ready, so a loading, warming or
  draining instance gets no new requests within one interval;
* ``unreachable_after`` polls in a row could not connect: unhealthy until a
  poll succeeds (a request would not connect either);
* ``/load`` answered without a report (401/403: not authorised, 404: no such
  endpoint): the catalog's entry as it is, with a warning once per instance;
* not polled yet (just listed): the catalog's entry; newly listed instances
  are polled at once rather than at the next interval.

Metrics (in the router's registry): ``router_load_polls_total{outcome}``
(``ok``, ``unreachable``, ``no_report``) and ``router_load_poll_round_seconds``
(how long the last round over every instance took).
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass

import httpx
from prometheus_client import CollectorRegistry, Counter, Gauge

from servekit.engine.protocol import LoadReport
from servekit.errors import ServeError
from servekit.load_reading import LoadNotReported, read_load_report
from servekit.registry import CatalogView, InstanceInfo, InstanceState
from servekit.rtt import MeasuredRtt
from servekit.tls import describe_tls_error
from servekit.winddown import pause, wind_down

__all__ = ["LiveLoad"]

log = logging.getLogger(__name__)


@dataclass(slots=True)
class _Polled:
    load: LoadReport | None = None  # the last report
    at: float = 0.0  # wall time the last report was asked for
    failures: int = 0  # polls in a row that could not connect
    rtt: MeasuredRtt = dataclasses.field(default_factory=MeasuredRtt)  # answered polls' times


class LiveLoad:
    """``client_for`` gives the client asking an instance (its tier's token and CA)."""

    def __init__(
        self,
        view: CatalogView,
        client_for: Callable[[InstanceInfo], httpx.AsyncClient],
        interval_s: float,
        *,
        unreachable_after: int = 2,
        concurrency: int = 64,
        metrics_registry: CollectorRegistry | None = None,
    ) -> None:
        self._view = view
        self._client_for = client_for
        self.interval_s = interval_s
        self.unreachable_after = unreachable_after
        self._limit = asyncio.Semaphore(concurrency)
        self._stopping = asyncio.Event()  # set by stop()
        self._polled: dict[str, _Polled] = {}
        self._warned: set[str] = set()
        self._merged: list[InstanceState] = []
        self._built_for = -1  # the view generation _merged was built from
        self._polls: Counter | None = None
        self._round: Gauge | None = None
        if metrics_registry is not None:
            self._polls = Counter(
                "router_load_polls",
                "Polls of instances' /load, by outcome (ok, unreachable, no_report).",
                ["outcome"],
                registry=metrics_registry,
            )
            self._round = Gauge(
                "router_load_poll_round_seconds",
                "How long the last round of /load polls over every listed instance took.",
                registry=metrics_registry,
            )

    def snapshot(self) -> list[InstanceState]:
        """The catalog's instances with live load; cheap (rebuilt only on change)."""
        if self._built_for != self._view.generation:
            self._rebuild()
        return self._merged

    async def run(self) -> None:
        """Poll every interval, and newly listed instances as soon as they appear."""
        stopping = self._stopping
        async with asyncio.TaskGroup() as tg:
            follow = tg.create_task(self._follow_catalog())
            await self.poll_once()
            while not await pause(stopping, self.interval_s):
                await self.poll_once()
            follow.cancel()

    async def stop(self, task: asyncio.Task[None]) -> None:
        """Stop ``task`` (this poller's :meth:`run`) once its round under way is done
        (``servekit.winddown``)."""
        await wind_down(task, self._stopping)

    async def _follow_catalog(self) -> None:
        while True:
            await self._view.wait_changed(3600.0)
            new = [s for s in self._view.snapshot() if s.info.id not in self._polled]
            if new:
                await self._poll(new)
            self._rebuild()

    async def poll_once(self) -> None:
        started = time.monotonic()
        await self._poll(self._view.snapshot())
        if self._round is not None:
            self._round.set(time.monotonic() - started)
        self._rebuild()

    async def _poll(self, states: list[InstanceState]) -> None:
        listed = {s.info.id for s in self._view.snapshot()}
        for gone in self._polled.keys() - listed:
            del self._polled[gone]
        await asyncio.gather(*(self._poll_one(s) for s in states))

    async def _poll_one(self, state: InstanceState) -> None:
        polled = self._polled.setdefault(state.info.id, _Polled())
        asked = time.time()
        report: LoadReport | None = None
        answered = 200
        async with self._limit:
            try:
                report = await read_load_report(
                    self._client_for(state.info), state.info.url, rtt=polled.rtt
                )
            except LoadNotReported as exc:
                answered = exc.answered
            except ServeError as exc:
                polled.failures += 1
                self._count("unreachable")
                if polled.failures == self.unreachable_after:
                    why = describe_tls_error(exc) or exc  # a certificate naming another role
                    log.warning("instance %s at %s unreachable (%s); not routing to it until"
                                " it answers", state.info.id, state.info.url, why)  # fmt: skip
                return
        polled.failures = 0
        if report is None:
            self._count("no_report")
            if state.info.id not in self._warned:
                self._warned.add(state.info.id)
                log.warning("instance %s at %s answered /load with %d: routing on the"
                            " catalog's copy of its load, which a Consul agent may forward"
                            " minutes late", state.info.id, state.info.url, answered)  # fmt: skip
            return
        self._count("ok")
        polled.load, polled.at = report, asked

    def _count(self, outcome: str) -> None:
        if self._polls is not None:
            self._polls.labels(outcome).inc()

    def _rebuild(self) -> None:
        self._built_for = self._view.generation
        self._merged = [self._overlay(s) for s in self._view.snapshot()]

    def _overlay(self, state: InstanceState) -> InstanceState:
        polled = self._polled.get(state.info.id)
        if polled is None:
            return state
        if polled.failures >= self.unreachable_after:
            return dataclasses.replace(state, healthy=False)
        if polled.load is None:
            return state
        return dataclasses.replace(
            state,
            load=polled.load,
            healthy=state.healthy and polled.load.ready,
            last_heartbeat=polled.at,
            rtt_ms=polled.rtt.ms,
        )
