"""The simulator routes as the router does: load reports carry what an edge's
/load carries (its engine's TTFT P50/P95, busy slowdown and rates), the
router's busy penalty spills requests to a second edge while the first is busy,
and its own count of requests in flight and of those that ended since a report
corrects stale ones."""

from __future__ import annotations

import pytest

from hybrid_llm.fleet.sim import (
    CenterSpec,
    EngineProfile,
    Instance,
    PolicySpec,
    RegionSpec,
    SimConfig,
    Simulation,
    WarmState,
    WorkloadSpec,
)
from hybrid_llm.fleet.sim.config import LengthDist
from hybrid_llm.fleet.sim.events import EventLoop
from hybrid_llm.fleet.sim.request import Job, SimRequest

# The local topology's CPU edge, roughly: ~130 ms to first token, 30 ms steps.
EDGE = EngineProfile(
    prefill_tokens_per_s=346,
    decode_base_ms=30,
    decode_per_seq_ms=9.5,
    slots=4,
    queue_limit=32,
    chunk_tokens=128,
)


class Sink:
    def first_token(self, job: Job, now: float) -> None:
        return None

    def done(self, job: Job, now: float) -> None:
        return None


def test_reports_carry_the_engines_ttft_percentiles_and_rates() -> None:
    loop = EventLoop()
    inst = Instance("i", "edge", "a", EDGE, loop, Sink())
    assert inst.report().ttft_p50_ms is None  # nothing measured yet
    for i in range(3):
        req = SimRequest(i, "a", 0.0, 45, 16, False, cached_tokens=25)
        loop.at(i * 1.0, inst.submit, Job(req, rtt=0.0))
    loop.at(0.3, lambda: reports.append(inst.report()))
    reports: list[object] = []
    loop.run()
    during = reports[0]
    assert (during.running, during.waiting, during.capacity) == (1, 0, 4)  # type: ignore[attr-defined]
    final = inst.report()
    prefill_s = 45 / 346
    # From slot to first token, as the engine measures it.
    assert final.ttft_p50_ms == pytest.approx(prefill_s * 1000)
    assert final.ttft_p95_ms == pytest.approx(prefill_s * 1000)
    # Only the 20 tokens after the copied preamble are prefilled, in prefill_s each.
    assert final.prefill_tokens_per_s == pytest.approx(20 / prefill_s)
    # Decode tokens per busy second: 15 steps of 30 ms after each prefill.
    assert final.decode_tokens_per_s == pytest.approx(15 / (prefill_s + 15 * 0.030), rel=0.05)


def test_reports_carry_the_busy_slowdown_the_instance_measured() -> None:
    loop = EventLoop()
    inst = Instance("i", "edge", "a", EDGE, loop, Sink())
    for i in range(4):  # alone: 130 ms to the first token, then 15 steps of 30 ms
        loop.at(i * 1.0, inst.submit, Job(SimRequest(i, "a", 0.0, 45, 16, False, 25), 0.0))
    for i in range(8):  # a second one 0.2 s after the first, while it decodes
        for at in (10.0 + i, 10.2 + i):
            req = SimRequest(10 + 2 * i, "a", 0.0, 45, 16, False, cached_tokens=25)
            loop.at(at, inst.submit, Job(req, rtt=0.0))
    loop.at(10.0, lambda: reports.append(inst.report()))
    reports: list[object] = []
    loop.run()
    assert reports[0].busy_ms_per_seq is None  # type: ignore[attr-defined]
    # The decoder rides along in the newcomer's one prefill step: 9.5 ms per sequence.
    assert inst.report().busy_ms_per_seq == pytest.approx(9.5)


def _local(
    weight: float = 1.0, neighbour_ms: float = 40, learn: bool = True, **kw: object
) -> SimConfig:
    """configs/local-sim.yaml's shape: users and edge-a in a, edge-b 40 ms away."""
    base: dict[str, object] = {
        "rtt": {"same_region_ms": 2, "default_ms": 150, "rtt_ms": {"a": {"b": neighbour_ms}}},
        "regions": [RegionSpec(name="a", edges=1, rate=1.0), RegionSpec(name="b", rate=0.0)],
        "edge_profile": EDGE,
        "center": CenterSpec(region="c", replicas=1, profile=EDGE),
        "workload": WorkloadSpec(
            prompt_tokens=LengthDist(kind="fixed", value=45),
            output_tokens=LengthDist(kind="fixed", value=16),
            hard_fraction=0.0,
            cached_prefix_tokens=25,
            template_tokens=33,
        ),
        "policy": PolicySpec(
            name="hybrid",
            router={"center_bias_ms": 1000, "busy_slowdown_weight": weight}
            # learn=False: the formula alone (the TTFT predictor never learns).
            | ({} if learn else {"prediction": {"enabled": False}}),
        ),
        # What the real edges reported: a's TTFT window has a long tail (P95 - P50 400 ms).
        "warm": {
            "edge/a/0": {"ttft_p50_ms": 150, "ttft_p95_ms": 550, "samples": 300}
            | {"decode_tokens_per_s": 25, "prefill_tokens_per_s": 115},
            "edge/b/0": {"ttft_p50_ms": 145, "ttft_p95_ms": 250, "samples": 50}
            | {"decode_tokens_per_s": 25, "prefill_tokens_per_s": 105},
        },
        "duration_s": 300,
        "warmup_s": 5,
        "seed": 1,
    }
    base.update(kw)
    return SimConfig.model_validate(base)


def _routes(config: SimConfig) -> list[str]:
    result = Simulation(config).run()
    return [
        r.winner.instance.region
        for r in result.requests
        if r.winner is not None and r.winner.instance is not None
    ]


def test_busy_penalty_spills_to_the_second_edge_under_overlap() -> None:
    # edge-b 10 ms away: an arrival while edge-a runs one or more sequences is
    # predicted 9.5 ms (what edge-a measures) slower per sequence there.
    with_penalty = _routes(_local(neighbour_ms=10, learn=False))
    without = _routes(_local(weight=0.0, neighbour_ms=10, learn=False))
    assert len(with_penalty) > 250
    share = with_penalty.count("b") / len(with_penalty)
    # About the share of arrivals that find edge-a busy (some ~40%) goes to edge-b.
    assert 0.15 < share < 0.5
    # Without the penalty a busy edge below its slot count looks idle.
    assert without.count("b") / len(without) < 0.05
    # Unless the router learns from the first tokens it sees what running sequences cost.
    learned = _routes(_local(weight=0.0, neighbour_ms=10))
    assert 0.15 < learned.count("b") / len(learned) < 0.5


def test_router_counts_its_own_requests_and_discounts_stale_reports() -> None:
    # Polls at 0, 1, 2 s. The first request (0.5-1.1 s) is running in the report
    # of 1 s; the second (1.6 s) must still go to edge-a, since the router saw the
    # first end after that report; the third (1.8 s) finds the second in flight.
    config = _local(
        regions=[
            RegionSpec(name="a", edges=1, arrivals=[0.5, 1.6, 1.8]),
            RegionSpec(name="b", rate=0.0),
        ],
        duration_s=10,
        warmup_s=0,
    )
    # Before the run edge-a had measured 100 ms per running sequence.
    config.warm["edge/a/0"].busy_ms_per_seq = 100.0
    assert _routes(config) == ["a", "a", "b"]


@pytest.mark.parametrize("samples", [2, 5, 41, 512])
def test_warm_start_reports_what_the_real_engine_reported(samples: int) -> None:
    inst = Instance("i", "edge", "a", EDGE, EventLoop(), Sink())
    inst.warm(
        WarmState(
            ttft_p50_ms=150.0,
            ttft_p95_ms=550.0,
            samples=samples,
            decode_tokens_per_s=25.0,
            prefill_tokens_per_s=115.0,
        )
    )
    report = inst.report()
    assert (report.ttft_p50_ms, report.ttft_p95_ms) == (150.0, 550.0)
    assert report.decode_tokens_per_s == pytest.approx(25.0, rel=0.01)
    assert report.prefill_tokens_per_s == pytest.approx(115.0)
