"""The hybrid policy driven by the router's own code: ``geo_router.scoring``,
``geo_router.tracker`` and the hedge rule of ``geo_router.dispatch``.

Every ``poll_interval_s`` the router reads each instance's ``/load`` over the
RTT between them (the static registry's probe: ``/ready``, then ``/load``;
the report is taken one and a half RTTs after the poll starts and stamped as
its heartbeat half an RTT later), so it routes on reports up to a period old.
The simulated instances report what a real edge does (running and waiting
counts, its recent TTFT P50/P95, decode and prefill rates; see
:meth:`hybrid_llm.fleet.sim.instance.Instance.report`). The router's
:class:`~geo_router.tracker.Tracker` counts its own requests in flight and the
ones that ended since a report (so a stale report is discounted), its own TTFT
per instance and each request's predicted TTFT there (``geo_router.predictor``,
learned from the first tokens it hears: the hedge delay), and 429s (ranked last
for a moment); its
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
import weakref
from collections.abc import Callable

from geo_router.dispatch import hedge_delay_s  # the dispatcher's own hedge rule
from geo_router.planner import rank_classified, tier_bias_ms  # the planner's own ranking
from geo_router.predictor import Prediction
from geo_router.scoring import Scored, Scorer
from geo_router.settings import RoutingSettings
from geo_router.tracker import Tracker
from hybrid_llm.fleet.sim.events import EventLoop
from hybrid_llm.fleet.sim.policy import Fleet, Target
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


def _info(target: Target, capacity: int) -> InstanceInfo:
    return InstanceInfo(
        id=target.name,
        tier=target.tier,
        region=target.region,
        address="sim",
        port=0,
        model="sim",
        capacity=capacity,
    )


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
        self.tracker = Tracker(routing.breaker, routing.prediction)
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
        self._scored: dict[str, Scored] = {}
        # Each request's predictions per instance, until its first token teaches one.
        self._predicted: weakref.WeakKeyDictionary[SimRequest, dict[str, Prediction]] = (
            weakref.WeakKeyDictionary()
        )

    # -- the router's view of the fleet: polled load reports ------------------
    def start(self, loop: EventLoop, fleet: Fleet, until: float) -> None:
        targets: list[Target] = [e for edges in fleet.edges.values() for e in edges]
        targets.append(fleet.center)
        home = self.router_region or next(iter(fleet.edges), fleet.center.region)
        for target in targets:
            report = target.report()  # the registry's first probe, before serving
            self._infos[target.name] = _info(target, report.capacity)
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
    def candidates(self, req: SimRequest, fleet: Fleet) -> list[Target]:
        now = self.clock()
        available = self.tracker.available
        edges = [
            e
            for e in fleet.sample_edges(req.region, self.choices, self.rng)
            if available(e.name, now)
        ]
        center: Target = fleet.center
        by_id: dict[str, Target] = {t.name: t for t in edges}
        by_id[center.name] = center
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
        pool = edges + ([center] if available(center.name, now) else [])
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
        ordered = ordered[: self.routing.max_attempts]
        self._scored = {s.id: s for s in ordered}
        self._predicted[req] = {s.id: s.prediction for s in ordered if s.prediction is not None}
        return [by_id[s.id] for s in ordered]

    # -- what the router hears --------------------------------------------------
    def hedge_after(self, target: Target) -> float | None:
        if not self.hedge:
            return None
        scored = self._scored.get(target.name)
        if scored is None:
            return self.routing.hedge.default_delay_ms / 1000.0
        return hedge_delay_s(self.routing.hedge, self.tracker, scored)

    def sent(self, target: Target) -> None:
        self.tracker.acquire(target.name, self.clock())

    def primed(self, req: SimRequest, target: Target, ttft_s: float) -> None:
        predicted = self._predicted.pop(req, {}).get(target.name)
        self.tracker.success(target.name, ttft_s * 1000.0, predicted, self.clock())

    def released(self, target: Target, failed: bool = False) -> None:
        now = self.clock()
        self.tracker.release(target.name, now)
        if failed:  # a 429: busy, not broken (the router's dispatcher books it so)
            self.tracker.refused(target.name, self.routing.shed_backoff_s, now)
