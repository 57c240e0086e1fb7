"""The hybrid policy driven by the router's own code: ``geo_router.scoring`` and
``geo_router.planner``'s ranking make the plan, which the router's own dispatcher
(``geo_router.dispatch``, its attempts booking ``geo_router.tracker``) tries.

Every ``poll_interval_s`` the router reads each instance's ``/load`` over the
RTT between them (the static registry's probe: ``/ready``, then ``/load``;
the report is taken one and a half RTTs after the poll starts and stamped as
its heartbeat half an RTT later), so it routes on reports up to a period old.
The simulated instances report what a real edge does (running and waiting
counts, its recent TTFT P50/P95, decode and prefill rates; see
:meth:`hybrid_llm.fleet.sim.instance.Instance.report`). The router's
:class:`~geo_router.tracker.Tracker`, booked by the dispatcher's attempts,
counts its own requests in flight and the ones that ended since a report (so a
stale report is discounted), its own TTFT per instance and each request's
predicted TTFT there (``geo_router.predictor``, learned from the first tokens it
hears: the hedge delay and the first-token deadline), missed deadlines (its
circuit breaker) and 429s (ranked last for their ``Retry-After``); its
:class:`~geo_router.scoring.Scorer` predicts each candidate's TTFT (RTT + queue
wait + prefill + busy slowdown, power-of-two choices among the near-best) and
orders them. The tier logic is ``geo_router.planner``'s own
(:func:`~geo_router.planner.rank_classified`): simple requests score edges and
the center (with the center's cost bias) together, hard requests go to the
center with edges as the last resort, candidates over their TTFT budget go
last, and a center is kept among the first ``max_attempts`` candidates so
failover ends there.

The router estimates a prompt's tokens from the text the client sent
(``estimate_prompt_tokens``); the simulator has token counts, and leaves out
the workload's ``template_tokens`` (the chat template's, which the client
never sent). Its prefix index is taken as warm: every instance is charged
only the tokens beyond the workload's ``cached_prefix_tokens`` (a shared
system prompt every instance has seen), as the router charges them once it
has sent that prefix everywhere.
"""

from __future__ import annotations

import random
from collections.abc import Callable

from geo_router.planner import rank_classified, tier_bias_ms  # the planner's own ranking
from geo_router.routing_settings import RoutingSettings
from geo_router.scoring import Scored, Scorer
from geo_router.tracker import Tracker
from hybrid_llm.fleet.sim.events import EventLoop
from hybrid_llm.fleet.sim.policy import Fleet, Target, instance_info
from hybrid_llm.fleet.sim.request import SimRequest
from servekit.engine.protocol import LoadReport
from servekit.registry.protocol import InstanceInfo, InstanceState, Tier
from servekit.rtt import RttTable

__all__ = ["RouterPolicy", "router_routing"]


def router_routing(mean_output: float, **overrides: object) -> RoutingSettings:
    """Router settings for a simulated fleet: defaults, the workload's typical
    output as ``default_max_tokens`` (the router's service-time estimate), and
    no slow start (every simulated instance is warm from t=0)."""
    data: dict[str, object] = {
        "default_max_tokens": max(1, round(mean_output)),
        "slow_start_s": 0.0,
    }
    data.update(overrides)
    return RoutingSettings.model_validate(data)


class RouterPolicy:
    """Candidates as ``geo_router`` orders them; ``clock`` is the simulation's time."""

    def __init__(
        self,
        rtt: RttTable,
        rng: random.Random,
        routing: RoutingSettings,
        clock: Callable[[], float],
        *,
        choices: int = 2,
        hedge: bool = False,
        poll_interval_s: float = 1.0,
        router_region: str | None = None,
    ) -> None:
        self.routing = routing
        # Booked by the dispatcher's attempts (geo_router.attempt), on the simulation's clock.
        self.tracker = Tracker(routing.breaker, routing.prediction, clock=clock, wall=clock)
        self.scorer = Scorer(routing, rtt, self.tracker, rng)
        self.rtt = rtt
        self.rng = rng
        self.clock = clock
        # Rent paid per prefix for serving it away from a same-city edge: once it
        # covers the cold start there, the router moves the prefix home
        # (``geo_router.planner``, the ski-rental rule).
        self._rent: dict[str, float] = {}
        self.choices = choices
        self.hedge = hedge
        self.poll_interval_s = poll_interval_s
        self.router_region = router_region
        self.states: dict[str, InstanceState] = {}
        self._infos: dict[str, InstanceInfo] = {}

    # -- the router's view of the fleet: polled load reports ------------------
    def start(self, loop: EventLoop, fleet: Fleet, until: float) -> None:
        targets: list[Target] = [e for edges in fleet.edges.values() for e in edges]
        targets.append(fleet.center)
        home = self.router_region or next(iter(fleet.edges), fleet.center.region)
        for target in targets:
            report = target.report()  # the registry's first probe, before serving
            self._infos[target.name] = instance_info(target, report.capacity)
            self._publish(loop, target.name, report)
        loop.after(self.poll_interval_s, self._poll, loop, targets, home, until)

    def _poll(self, loop: EventLoop, targets: list[Target], home: str, until: float) -> None:
        for target in targets:
            rtt = self.rtt.rtt(home, target.region) / 1000.0
            loop.after(1.5 * rtt, self._probe, loop, target, rtt)
        if loop.now + self.poll_interval_s < until:  # no routing after the last arrival
            loop.after(self.poll_interval_s, self._poll, loop, targets, home, until)

    def _probe(self, loop: EventLoop, target: Target, rtt: float) -> None:
        loop.after(0.5 * rtt, self._publish, loop, target.name, target.report())

    def _publish(self, loop: EventLoop, name: str, report: LoadReport) -> None:
        self.states[name] = InstanceState(
            info=self._infos[name], load=report, healthy=True, last_heartbeat=loop.now
        )

    # -- routing ----------------------------------------------------------------
    def plan(self, req: SimRequest, fleet: Fleet) -> list[Scored]:
        now = self.clock()
        available = self.tracker.available
        edges = [
            e for e in fleet.sample_edges(req.region, self.choices, self.rng) if available(e.name)
        ]
        center: Target = fleet.center
        tokens = req.estimated_tokens or req.prompt_tokens

        def score(target: Target, bias_ms: float = 0.0) -> Scored:
            # The router's prefix index, warm: it knows which prefix each instance
            # holds (the cached tokens less the template, which no client sends).
            held = req.cached_at(target.holds(req.prefix))
            cached = max(0, held - (req.prompt_tokens - tokens))
            state = self.states[target.name]
            return self.scorer.score(
                state, req.region, tokens, bias_ms, now=now, cached_tokens=cached
            )

        preferred: Tier = "center" if req.hard else "edge"
        pool = edges + ([center] if available(center.name) else [])
        scored = [score(t, tier_bias_ms(self.routing, preferred, t.tier)) for t in pool]
        key = req.prefix

        def rent_paid(_anchor: int) -> float:
            return self._rent.get(key, 0.0) if key is not None else 0.0

        ordered = rank_classified(
            scored, preferred, req.region, self.routing, self.scorer.order, rent_paid
        )
        if key is not None and ordered:
            if ordered[0].warming:
                self._rent.pop(key, None)
            elif ordered[0].rent_ms > 0:
                self._rent[key] = self._rent.get(key, 0.0) + ordered[0].rent_ms
        return ordered[: self.routing.max_attempts]
