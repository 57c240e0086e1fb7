"""Routing policies: the seam between the simulator and the routing code.

A policy sees the request and the fleet and returns the ordered candidates,
scored as the router scores them: the router's dispatcher tries the first,
falls back to the next after a 429 or a missed first-token deadline, and
races the next with a hedge. The hybrid policies are the router's own scoring
(:mod:`hybrid_llm.fleet.sim.router_policy`); this module has the fleet, the center
pool and the all-to-center baseline.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Literal, Protocol

from geo_router.routing_settings import RoutingSettings
from geo_router.scoring import Scored
from geo_router.tracker import Circuit, Tracker
from hybrid_llm.fleet.sim.events import EventLoop
from hybrid_llm.fleet.sim.instance import Instance
from hybrid_llm.fleet.sim.request import Job, SimRequest
from servekit.engine.protocol import LoadReport, pooled_figures
from servekit.registry.protocol import InstanceInfo, InstanceState
from servekit.rtt import RttTable

__all__ = ["AllToCenter", "CenterPool", "Fleet", "Policy", "Target", "instance_info"]


class Target(Protocol):
    """Something a request can be sent to: an edge instance or the center gateway."""

    @property
    def name(self) -> str: ...

    @property
    def tier(self) -> Literal["edge", "center"]: ...

    @property
    def region(self) -> str: ...

    def report(self) -> LoadReport: ...

    def submit(self, job: Job) -> bool: ...

    def holds(self, prefix: str | None) -> bool:
        """Whether a cached prefix lives there (the router's prefix index knows)."""
        ...


class CenterPool:
    """The central gateway: one target in front of replicas, least-loaded first."""

    tier: Literal["edge", "center"] = "center"

    def __init__(self, region: str, replicas: Sequence[Instance]) -> None:
        self.name = f"center/{region}"
        self.region = region
        self.replicas = list(replicas)

    def report(self) -> LoadReport:
        """The gateway's ``/load``: its replicas' reports pooled as ``central.pool`` pools them."""
        reports = [r.report() for r in self.replicas]
        return replace(
            pooled_figures(reports, len(reports)),
            ready=True,
            waiting=sum(x.waiting for x in reports),
            running=sum(x.running for x in reports),
            capacity=sum(x.capacity for x in reports),
            queue_limit=sum(x.queue_limit for x in reports),
        )

    def submit(self, job: Job) -> bool:
        replica = min(self.replicas, key=lambda r: r.used + len(r.waiting))
        return replica.submit(job)

    def holds(self, prefix: str | None) -> bool:
        return any(r.holds(prefix) for r in self.replicas)


@dataclass
class Fleet:
    edges: dict[str, list[Instance]]
    center: CenterPool
    rtt: RttTable

    def __post_init__(self) -> None:
        self._others = {
            region: [e for r, edges in self.edges.items() if r != region for e in edges]
            for region in self.edges
        }

    def rtt_s(self, a: str, b: str) -> float:
        return self.rtt.rtt(a, b) / 1000.0

    def sample_edges(
        self, region: str, k: int, rng: random.Random, remote: int = 1
    ) -> list[Instance]:
        """Up to ``k`` random edges of ``region`` and ``remote`` of the other regions.

        A router scores every healthy edge; sampling keeps the simulator's cost
        per request constant on a thousand-edge fleet. Remote edges carry their
        RTT in the score, so they win only when the local ones are busy.
        """
        local = self.edges.get(region, [])
        others = self._others.get(region, [])
        out = rng.sample(local, k) if len(local) > k else list(local)
        out += rng.sample(others, remote) if len(others) > remote else others
        return out


def instance_info(target: Target, capacity: int) -> InstanceInfo:
    """How the router's registry lists ``target``; its URL names it, for the
    simulation's transport (``hybrid_llm.fleet.sim.transport``)."""
    return InstanceInfo(
        id=target.name,
        tier=target.tier,
        region=target.region,
        address=target.name.replace("/", "."),
        port=80,
        model="sim",
        capacity=capacity,
    )


class Policy(Protocol):
    """Chooses where a request goes: the plan the router's dispatcher
    (``geo_router.dispatch``) tries in order, with these settings and tracker."""

    routing: RoutingSettings
    tracker: Tracker
    hedge: bool  # a second attempt races a slow first one

    def start(self, loop: EventLoop, fleet: Fleet, until: float) -> None:
        """Begin whatever runs in the background until ``until`` (polling load reports)."""
        ...

    def plan(self, req: SimRequest, fleet: Fleet) -> list[Scored]: ...


class AllToCenter:
    """Every request to the center (one candidate: no deadline, no hedge)."""

    hedge = False

    def __init__(self, clock: Callable[[], float]) -> None:
        self.routing = RoutingSettings()
        self.tracker = Tracker(self.routing.breaker, clock=clock, wall=clock)
        self._plan: list[Scored] = []

    def start(self, loop: EventLoop, fleet: Fleet, until: float) -> None:
        info = instance_info(fleet.center, fleet.center.report().capacity)
        state = InstanceState(info, LoadReport(ready=True), True, loop.now)
        self._plan = [Scored(state, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 1.0, Circuit.CLOSED)]

    def plan(self, req: SimRequest, fleet: Fleet) -> list[Scored]:
        return self._plan
