"""The simulator routes through the router's own dispatcher (``geo_router.dispatch``):
a hung instance is cut at the attempt's own first-token deadline and the next
candidate serves; a hedge races a slow attempt after the request's predicted P90."""

from __future__ import annotations

import pytest

from geo_router.attempt import first_token_deadline_s
from geo_router.dispatch import hedge_delay_s
from geo_router.scoring import Scored
from hybrid_llm.fleet.sim import (
    CenterSpec,
    EngineProfile,
    Instance,
    PolicySpec,
    RegionSpec,
    SimConfig,
    Simulation,
    WorkloadSpec,
)
from hybrid_llm.fleet.sim.config import LengthDist
from hybrid_llm.fleet.sim.request import Job, SimRequest

EDGE = EngineProfile(
    prefill_tokens_per_s=346, decode_base_ms=30, decode_per_seq_ms=9.5, slots=4, queue_limit=32
)


def _config(arrivals: list[float], policy: str = "hybrid") -> SimConfig:
    """Users and one edge in a; the center 150 ms away (so simple requests try the edge)."""
    return SimConfig.model_validate(
        {
            "rtt": {"same_region_ms": 2, "default_ms": 150},
            "regions": [RegionSpec(name="a", edges=1, arrivals=arrivals)],
            "edge_profile": EDGE,
            "center": CenterSpec(region="c", replicas=1, profile=EDGE),
            "workload": WorkloadSpec(
                prompt_tokens=LengthDist(kind="fixed", value=45),
                output_tokens=LengthDist(kind="fixed", value=16),
                hard_fraction=0.0,
            ),
            "policy": PolicySpec(name=policy, router={"center_bias_ms": 100}),
            "duration_s": 60,
            "warmup_s": 0,
            "seed": 1,
        }
    )


def _hang(sim: Simulation, name: str, ids: set[int], monkeypatch: pytest.MonkeyPatch) -> None:
    """``name`` admits these requests and never answers them (a hung engine)."""
    inst = next(i for i in sim.instances if i.name == name)
    serve = inst.submit

    def submit(job: Job) -> bool:
        if job.req.id not in ids:
            return serve(job)
        job.instance = inst  # admitted, and never scheduled
        return True

    monkeypatch.setattr(inst, "submit", submit)


def _plans(sim: Simulation, monkeypatch: pytest.MonkeyPatch) -> dict[int, list[Scored]]:
    """Each request's plan, as the policy handed it to the dispatcher."""
    plans: dict[int, list[Scored]] = {}
    plan = sim.policy.plan

    def recorded(req: SimRequest, fleet: object) -> list[Scored]:
        plans[req.id] = out = plan(req, sim.fleet)
        return out

    monkeypatch.setattr(sim.policy, "plan", recorded)
    return plans


def _instance(job: Job) -> Instance:
    assert job.instance is not None
    return job.instance


def test_a_hung_edge_is_cut_at_the_attempts_deadline_and_the_center_serves(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    sim = Simulation(_config([1.0]))
    _hang(sim, "edge/a/0", {0}, monkeypatch)
    plans = _plans(sim, monkeypatch)
    (req,) = sim.run().requests
    first, second = req.jobs
    assert [_instance(j).name for j in req.jobs] == ["edge/a/0", "center/0"]
    assert not req.failed
    assert req.winner is second
    assert req.ttft is not None
    # The next candidate was sent the moment the first one's own deadline passed.
    deadline = first_token_deadline_s(sim.policy.routing, plans[0][0])
    assert second.sent - first.sent == pytest.approx(deadline)
    assert req.ttft > deadline
    # The hung edge was told to stop, and the router booked a failure there (the
    # dispatcher's rule: a missed first token counts against the instance).
    assert first.cancelled
    assert first.first_token is None
    assert (req.fallbacks, req.hedged) == (1, False)
    stats = sim.policy.tracker.stats("edge/a/0")
    assert (stats.failures, stats.inflight) == (1, 0)


def test_a_hedge_races_a_slow_edge_after_the_requests_predicted_p90(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Twenty requests teach the edge's TTFT model; the last one hangs there.
    arrivals = [0.5 * i for i in range(1, 22)]
    sim = Simulation(_config(arrivals, policy="hybrid-hedge"))
    last = len(arrivals) - 1
    _hang(sim, "edge/a/0", {last}, monkeypatch)
    plans = _plans(sim, monkeypatch)
    req = sim.run().requests[last]
    cand = plans[last][0]
    assert cand.id == "edge/a/0"
    p90 = cand.ttft_p90_ms
    assert p90 is not None  # learned: the hedge delay is this request's P90 there
    delay = hedge_delay_s(sim.policy.routing.hedge, sim.policy.tracker, cand)
    assert delay == max(sim.policy.routing.hedge.min_delay_ms, p90) / 1000.0
    first, hedge = req.jobs
    assert hedge.sent - first.sent == pytest.approx(delay)
    assert req.hedged
    assert req.winner is hedge
    assert _instance(hedge).tier == "center"
    # The losing attempt is abandoned, not failed: its instance is told to stop.
    assert first.cancelled
    assert sim.policy.tracker.stats("edge/a/0").failures == 0
