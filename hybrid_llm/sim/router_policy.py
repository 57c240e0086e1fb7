"""The hybrid policy driven by the router's own code: ``geo_router.scoring``.

Each candidate becomes the ``InstanceState`` the router would read from the
registry (identity plus the load report the instance heartbeats), the router's
:class:`~geo_router.scoring.Scorer` predicts its TTFT (RTT + queue wait +
prefill, slow start, power-of-two choices among the near-best) and orders
them; the tier logic follows ``geo_router.planner``: simple requests score
edges and the center (with the center's cost bias) together, hard requests go
to the center with edges as the last resort, and a center is kept among the
first ``max_attempts`` candidates so failover ends there.
"""

from __future__ import annotations

import random
from collections.abc import Callable

from geo_router.planner import ensure_center  # the planner's own failover rule
from geo_router.region import RttTable as RouterRtt
from geo_router.scoring import Scored, Scorer
from geo_router.settings import RegionSettings, RoutingSettings
from geo_router.tracker import Tracker
from hybrid_llm.geography import RttTable
from hybrid_llm.sim.instance import LoadView
from hybrid_llm.sim.policy import Fleet, Target
from hybrid_llm.sim.request import SimRequest
from servekit.engine.protocol import LoadReport
from servekit.registry.protocol import InstanceInfo, InstanceState

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


def _state(target: Target, load: LoadView) -> InstanceState:
    info = InstanceInfo(
        id=target.name,
        tier=target.tier,
        region=target.region,
        address="sim",
        port=0,
        model="sim",
        capacity=load.capacity,
    )
    report = LoadReport(
        ready=True,
        waiting=load.waiting,
        running=load.running,
        capacity=load.capacity,
        queue_limit=load.queue_limit,
        decode_tokens_per_s=1.0 / load.decode_step_s,
        prefill_tokens_per_s=load.prefill_tokens_per_s,
    )
    return InstanceState(info=info, load=report, healthy=True, last_heartbeat=0.0)


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
        hedge_after_s: float | None = None,
    ) -> None:
        regions = RegionSettings(
            rtt_ms=rtt.rtt_ms, same_region_rtt_ms=rtt.same_region_ms, unknown_rtt_ms=rtt.default_ms
        )
        self.routing = routing
        self.scorer = Scorer(routing, RouterRtt(regions), Tracker(routing.breaker), rng)
        self.rng = rng
        self.clock = clock
        self.choices = choices
        self.hedge_after_s = hedge_after_s

    def candidates(self, req: SimRequest, fleet: Fleet) -> list[Target]:
        now = self.clock()
        pool: list[tuple[Target, LoadView]] = []
        for edge in fleet.sample_edges(req.region, self.choices, self.rng):
            load = edge.load()
            if load.waiting < load.queue_limit:  # a full one would answer 429
                pool.append((edge, load))
        center: Target = fleet.center
        by_id: dict[str, Target] = {t.name: t for t, _ in pool}
        by_id[center.name] = center

        def score(target: Target, load: LoadView, bias_ms: float = 0.0) -> Scored:
            state = _state(target, load)
            return self.scorer.score(state, req.region, req.prompt_tokens, bias_ms, now=now)

        if req.hard:
            ordered = self.scorer.order([score(center, center.load())])
            if self.routing.hard_may_use_edge:
                ordered += sorted(
                    (score(e, load) for e, load in pool), key=lambda s: s.predicted_ms
                )
        else:
            scored = [score(e, load) for e, load in pool]
            scored.append(score(center, center.load(), self.routing.center_bias_ms))
            ordered = ensure_center(self.scorer.order(scored), self.routing.max_attempts)
        return [by_id[s.id] for s in ordered]
