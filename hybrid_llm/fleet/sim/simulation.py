"""The fleet simulation: users in regions send requests through the routing
policy to edge instances or the center, over the region RTT table.

Timing of one request (the router sits in the user's city, as a regional
front door would): the client reaches the router after half the same-city
RTT; the router adds its overhead, plans (the policy) and dispatches with its
own dispatcher (``geo_router.dispatch.first_primed``) over the simulated
network (:mod:`hybrid_llm.fleet.sim.transport`: half the router→instance RTT
each way); the first token travels back the same way. A 429 from a full
instance costs that round trip and the next candidate is tried; so is one
that misses its attempt's first-token deadline; a hedge races the next
candidate after the dispatcher's hedge delay, and the loser is cancelled when
the winner's first token reaches the router. Instances and dispatcher share
one virtual clock (:mod:`hybrid_llm.fleet.sim.events`).
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal

from geo_router.attempt import Routing
from geo_router.dispatch import first_primed
from geo_router.metrics import RouterMetrics
from geo_router.region import ResolvedRegion
from geo_router.request import RouteRequest
from hybrid_llm.fleet.sim.config import SimConfig, WarmState
from hybrid_llm.fleet.sim.events import EventLoop
from hybrid_llm.fleet.sim.instance import Instance
from hybrid_llm.fleet.sim.policy import AllToCenter, CenterPool, Fleet, Policy
from hybrid_llm.fleet.sim.profiles import EngineProfile
from hybrid_llm.fleet.sim.protection import EdgeProtection
from hybrid_llm.fleet.sim.request import Job, SimRequest
from hybrid_llm.fleet.sim.transport import REQUEST_HEADER, SimTransport
from servekit.errors import ServeError

__all__ = ["SimResult", "Simulation", "build_policy"]

_PATH = "/v1/chat/completions"
# What the simulated client sends (the instances simulate the work from the SimRequest).
_BODY: dict[str, Any] = {"model": "auto", "messages": [{"role": "user", "content": "sim"}]}


def build_policy(config: SimConfig, rng: random.Random, clock: Callable[[], float]) -> Policy:
    """The configured policy; the hybrid ones route with the router's own scoring."""
    spec = config.policy
    if spec.name == "all-center":
        return AllToCenter(clock)
    from hybrid_llm.fleet.sim.router_policy import RouterPolicy, router_routing

    router = dict(spec.router)
    hedge = dict(router.get("hedge") or {})
    hedge.setdefault("default_delay_ms", spec.hedge_after_ms)
    router["hedge"] = hedge
    return RouterPolicy(
        config.rtt,
        rng,
        router_routing(config.workload.output_tokens.mean(), **router),
        clock,
        choices=spec.choices,
        hedge=spec.name == "hybrid-hedge",
        poll_interval_s=spec.poll_interval_s,
        router_region=spec.router_region,
    )


@dataclass
class SimResult:
    config: SimConfig
    requests: list[SimRequest]
    instances: list[Instance]
    sim_time: float
    events: int
    measured_from: float
    measured_to: float
    extra: dict[str, float] = field(default_factory=dict)


class Simulation:
    """Build the fleet from ``config`` and run it; :meth:`run` returns the result."""

    def __init__(self, config: SimConfig, policy: Policy | None = None) -> None:
        self.config = config
        self.loop = EventLoop()
        self.rng = random.Random(config.seed)
        self.policy = policy or build_policy(
            config, random.Random(config.seed + 1), lambda: self.loop.now
        )
        edges: dict[str, list[Instance]] = {}
        self.instances: list[Instance] = []
        for region in config.regions:
            edges[region.name] = [
                self._instance(f"edge/{region.name}/{i}", "edge", region.name, config.edge)
                for i in range(region.edges)
            ]
        replicas = [
            self._instance(f"center/{i}", "center", config.center.region, config.center_profile)
            for i in range(config.center.replicas)
        ]
        self.fleet = Fleet(edges, CenterPool(config.center.region, replicas), config.rtt)
        self.requests: list[SimRequest] = []
        self.transport = SimTransport(self.loop, self.fleet, self.requests)
        # What the router's dispatcher shares between requests.
        self.routing = Routing(
            self.transport,
            self.policy.tracker,
            RouterMetrics(),
            self.policy.routing,
            clock=self.loop.aio.time,
        )
        # Traced requests: the traces, where each request came from, and the next
        # turn of a conversation, sent when the answer before it arrives.
        self._traces = {r.name: r.trace or [] for r in config.regions}
        self._traced: dict[SimRequest, tuple[str, int]] = {}
        self._next_turn: dict[tuple[str, int], int] = {}
        self._client_s = config.rtt.same_region_ms / 1000.0
        self._overhead_s = config.policy.router_overhead_ms / 1000.0
        for inst in self.instances:
            # Warm from t=0: what the engine reported before, else its profile's rates.
            warm = config.warm.get(inst.name) or WarmState(
                decode_tokens_per_s=1000.0 / inst.profile.decode_base_ms,
                prefill_tokens_per_s=inst.profile.prefill_tokens_per_s,
            )
            inst.warm(warm)

    def _instance(
        self, name: str, tier: Literal["edge", "center"], region: str, profile: EngineProfile
    ) -> Instance:
        # Each instance draws its service times from its own seeded RNG.
        rng = random.Random(f"{self.config.seed}/{name}")
        guard = self.config.edge_protection if tier == "edge" else EdgeProtection()
        inst = Instance(name, tier, region, profile, self.loop, self, rng=rng, protection=guard)
        self.instances.append(inst)
        return inst

    # -- arrivals and dispatch ------------------------------------------------
    def run(self) -> SimResult:
        self.policy.start(self.loop, self.fleet, self.config.duration_s)
        for region in self.config.regions:
            if region.trace is not None:
                for index, traced in enumerate(region.trace):
                    if traced.follows is None:
                        at = self.config.warmup_s + traced.at
                        self.loop.at(at, self._replay, region.name, index)
                    else:
                        self._next_turn[(region.name, traced.follows)] = index
            elif region.arrivals is not None:
                for at in region.arrivals:
                    self.loop.at(self.config.warmup_s + at, self._arrive, region.name, 0.0)
            elif region.rate > 0:
                self.loop.at(
                    self.rng.expovariate(region.rate), self._arrive, region.name, region.rate
                )
        self.loop.at(self.config.warmup_s, self._snapshot, 0)
        self.loop.at(self.config.duration_s, self._snapshot, 1)
        # Drain: requests in flight at the end still finish (bounded by a generous cap).
        self.loop.run(until=self.config.duration_s * 4 + 600)
        return SimResult(
            self.config,
            self.requests,
            self.instances,
            self.loop.now,
            self.loop.processed,
            self.config.warmup_s,
            self.config.duration_s,
        )

    def _snapshot(self, which: int) -> None:
        """Utilisation counters at the edges of the measured window."""
        for inst in self.instances:
            inst.mark(which)

    def _arrive(self, region: str, rate: float) -> None:
        now = self.loop.now
        wl = self.config.workload
        req = SimRequest(
            id=len(self.requests),
            region=region,
            arrival=now,
            prompt_tokens=wl.prompt_tokens.sample(self.rng),
            output_tokens=wl.output_tokens.sample(self.rng),
            hard=self.rng.random() < wl.hard_fraction,
        )
        cached = wl.cached_prefix_tokens
        # Drawn only when configured, so other workloads keep their random streams.
        history_dist = wl.history_tokens if wl.followup_share > 0 else None
        if history_dist is not None and self.rng.random() < wl.followup_share:
            req.history_tokens = history_dist.sample(self.rng)
            req.prompt_tokens += req.history_tokens
            cached += req.history_tokens
        req.cached_tokens = min(cached, req.prompt_tokens - 1)
        self._send(req)
        nxt = now + self.rng.expovariate(rate) if rate > 0 else float("inf")
        if nxt < self.config.duration_s:
            self.loop.at(nxt, self._arrive, region, rate)

    def _replay(self, region: str, index: int) -> None:
        """A traced request: its own lengths and cache hit, as measured."""
        traced = self._traces[region][index]
        wl = self.config.workload
        prompt = traced.prompt_tokens
        req = SimRequest(
            id=len(self.requests),
            region=region,
            arrival=self.loop.now,
            prompt_tokens=prompt,
            output_tokens=traced.output_tokens,
            hard=self.rng.random() < wl.hard_fraction if traced.hard is None else traced.hard,
            cached_tokens=min(traced.cached_tokens, prompt - 1),
            preamble_tokens=min(wl.cached_prefix_tokens, prompt - 1),
            prefix=traced.prefix,
            conversation=traced.conversation,
        )
        self._traced[req] = (region, index)
        self._send(req)

    def _send(self, req: SimRequest) -> None:
        """The client's request reaches the router, which estimates its tokens and routes."""
        req.estimated_tokens = max(1, req.prompt_tokens - self.config.workload.template_tokens)
        self.requests.append(req)
        self.loop.after(self._client_s / 2 + self._overhead_s, self._route, req)

    def _route(self, req: SimRequest) -> None:
        self.loop.spawn(self._routed(req))

    async def _routed(self, req: SimRequest) -> None:
        """The router's own dispatch of ``req`` (``geo_router.dispatch``): the first
        candidate to prime wins, its stream is relayed to the end, and its attempt
        books the tracker; the transport carries it to the instances."""
        plan = self.policy.plan(req, self.fleet)
        if not plan:
            req.failed = True
            return
        route = RouteRequest(
            _BODY, "chat", _PATH, ResolvedRegion(req.region, "default", None), "",
            {REQUEST_HEADER: str(req.id)}, self.loop.now,
        )  # fmt: skip
        try:
            attempt, _ = await first_primed(self.routing, route, plan, hedge=self.policy.hedge)
        except ServeError:
            req.failed = True
            return
        req.winner = next(
            j for j in reversed(req.jobs) if j.target and j.target.name == attempt.cand.id
        )
        req.ttft = self.loop.now + self._client_s / 2 - req.arrival
        attempt.won()
        try:
            async for _ in attempt.relay():
                pass
        except ServeError:
            await attempt.broke()
            return
        await attempt.finished()

    # -- what instances report (InstanceSink) ---------------------------------
    def first_token(self, job: Job, now: float) -> None:
        self.transport.heard(job, "first_token")

    def done(self, job: Job, now: float) -> None:
        self.transport.heard(job, "done")
        req = job.req
        if job.first_token is None or job.cancelled:
            return
        if req.winner is not None and req.winner is not job:
            return
        if req.output_tokens > 1:
            req.tpot = (now - job.first_token) / (req.output_tokens - 1)
        req.e2e = now + job.rtt / 2 + self._client_s / 2 - req.arrival
        traced = self._traced.pop(req, None)
        nxt = self._next_turn.pop(traced, None) if traced is not None else None
        if traced is not None and nxt is not None:
            # The client sends its next turn once this answer has reached it.
            region = traced[0]
            gap = self._traces[region][nxt].gap_s
            self.loop.at(req.arrival + req.e2e + gap, self._replay, region, nxt)
