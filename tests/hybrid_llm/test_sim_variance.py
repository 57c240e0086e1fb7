"""Measured engine behaviour in the simulator: mixed prefill+decode steps and
service times drawn from the measured dispersion (seeded, reproducible)."""

from __future__ import annotations

import random
import statistics

import pytest

from hybrid_llm.fleet.sim import (
    CenterSpec,
    EngineProfile,
    Instance,
    RegionSpec,
    SimConfig,
    Simulation,
    WorkloadSpec,
)
from hybrid_llm.fleet.sim.config import LengthDist
from hybrid_llm.fleet.sim.events import EventLoop
from hybrid_llm.fleet.sim.request import Job, SimRequest
from hybrid_llm.fleet.sim.spread import SpreadSampler, merge_spreads, ratios_to_median, spread_of
from tests.support.sim import Recorder

PROFILE = EngineProfile(
    prefill_tokens_per_s=1000, decode_base_ms=10, decode_per_seq_ms=5, slots=2, queue_limit=1
)
# A right-skewed spread: most near the median, a tail to 3x.
SKEWED = [(0.0, 0.8), (0.25, 0.95), (0.5, 1.0), (0.75, 1.1), (0.9, 1.5), (1.0, 3.0)]


def _two_jobs(profile: EngineProfile) -> Recorder:
    loop = EventLoop()
    rec = Recorder()
    inst = Instance("i", "edge", "a", profile, loop, rec)
    for i in range(2):
        assert inst.submit(Job(SimRequest(i, "a", 0.0, 100, 11, False), rtt=0.0))
    loop.run()
    return rec


def test_spread_quantiles_and_draws() -> None:
    ratios = ratios_to_median([[1.0, 2.0, 3.0], [10.0, 10.0, 40.0]])
    assert ratios == [0.5, 1.0, 1.5, 1.0, 1.0, 4.0]
    spread = spread_of(ratios)
    assert spread[0] == (0.0, 0.5)
    assert spread[-1] == (1.0, 4.0)
    assert dict(spread)[0.5] == pytest.approx(1.0)
    assert spread_of([1.0, 1.2]) == []  # too few samples for a spread
    sampler = SpreadSampler(spread, random.Random(1))
    draws = [sampler.draw() for _ in range(4000)]
    assert min(draws) >= 0.5
    assert max(draws) <= 4.0
    assert statistics.median(draws) == pytest.approx(1.0, abs=0.05)
    assert statistics.mean(draws) == pytest.approx(sampler.mean, rel=0.05)
    # The mean of many steps varies less than one step, around the same mean.
    means = [sampler.draw_mean(400) for _ in range(300)]
    assert statistics.pstdev(means) < statistics.pstdev(draws) / 5
    assert statistics.mean(means) == pytest.approx(sampler.mean, rel=0.05)
    assert SpreadSampler([], random.Random(1)).draw() == 1.0
    assert merge_spreads([(0.0, 1.0), (1.0, 3.0)], [(0.0, 0.5), (1.0, 2.0)]) == [
        (0.0, 0.75),
        (1.0, 2.5),
    ]


def test_mixed_step_cost_replaces_per_sequence_cost_when_decoders_ride_along() -> None:
    # Without mixed points a rider adds its per-sequence step cost (5 ms) to a prefill.
    assert _two_jobs(PROFILE).first[1] == pytest.approx(0.205)
    # A measured mixed step: one rider adds 30 ms, of which half a 10 ms step was the
    # probe's wait for the step in flight. The second job, queued, starts at the step
    # boundary where the first one's prefill ends: no wait, 25 ms.
    mixed = PROFILE.model_copy(update={"mixed_points": [(1, 0.030), (3, 0.050)]})
    rec = _two_jobs(mixed)
    assert rec.first[0] == pytest.approx(0.1)  # nobody rode along in the first
    assert rec.first[1] == pytest.approx(0.225)
    assert mixed.mixed_extra_s(2) == pytest.approx(0.040)  # interpolated
    assert mixed.mixed_extra_s(5) == pytest.approx(0.070)  # the last slope continues
    assert mixed.mixed_extra_s(0) == 0.0
    # Chunked prefill: every chunk carries the riders, so their cost is paid per chunk.
    chunked = mixed.model_copy(update={"chunk_tokens": 40})  # 100 tokens -> 3 steps
    assert _two_jobs(chunked).first[1] == pytest.approx(0.2 + 3 * 0.025)
    # Arriving while the first decodes, the second waits for the step in flight too:
    # the whole measured 30 ms.
    loop = EventLoop()
    rec = Recorder()
    inst = Instance("i", "edge", "a", mixed, loop, rec)
    inst.submit(Job(SimRequest(0, "a", 0.0, 100, 11, False), rtt=0.0))
    late = Job(SimRequest(1, "a", 0.0, 100, 11, False), rtt=0.0)
    loop.at(0.13, inst.submit, late)
    loop.run()
    assert rec.first[1] == pytest.approx(0.13 + 0.1 + 0.030)


def _config(profile: EngineProfile, seed: int = 0, rate: float = 2.0) -> SimConfig:
    return SimConfig(
        regions=[RegionSpec(name="a", edges=1, rate=rate)],
        edge_profile=profile,
        center=CenterSpec(region="c", replicas=1),
        workload=WorkloadSpec(
            prompt_tokens=LengthDist(kind="fixed", value=100),
            output_tokens=LengthDist(kind="fixed", value=20),
            hard_fraction=0.0,
        ),
        policy={"name": "hybrid", "router": {"center_bias_ms": 100_000}},  # type: ignore[arg-type]
        duration_s=300,
        warmup_s=1,
        seed=seed,
    )


def _ttfts_tpots(config: SimConfig) -> tuple[list[float], list[float]]:
    reqs = Simulation(config).run().requests
    ttft = [r.ttft for r in reqs if r.ttft is not None]
    tpot = [r.tpot for r in reqs if r.tpot is not None]
    return ttft, tpot


def test_sampled_service_times_vary_and_are_reproducible_for_a_seed() -> None:
    profile = PROFILE.model_copy(update={"slots": 4, "queue_limit": 8})
    # Without spreads every lone request of one shape takes the same time (the few
    # arriving while another runs wait for it).
    flat, _ = _ttfts_tpots(_config(profile, rate=0.2))
    deciles = statistics.quantiles(flat, n=10)
    assert deciles[-1] - deciles[0] < 1e-9
    spread = profile.model_copy(update={"prefill_spread": SKEWED, "step_spread": {1: SKEWED}})
    ttft, tpot = _ttfts_tpots(_config(spread, rate=0.2))
    # The variance is there: TTFT ranges over the spread (prefill 0.1 s x 0.8..3).
    assert statistics.pstdev(ttft) > 0.01
    assert max(ttft) / min(ttft) > 1.5
    assert statistics.quantiles(ttft, n=20)[-1] > 1.3 * statistics.median(ttft)
    assert statistics.pstdev(tpot) > 0
    # The same seed gives the same run; another seed another one.
    again = _ttfts_tpots(_config(spread, rate=0.2))
    assert again == (ttft, tpot)
    other, _ = _ttfts_tpots(_config(spread, seed=1, rate=0.2))
    assert other != ttft


def test_step_spread_of_the_nearest_batch_size() -> None:
    profile = PROFILE.model_copy(update={"step_spread": {1: SKEWED, 4: [(0.0, 2.0), (1.0, 2.0)]}})
    assert profile.step_spread_for(1) == SKEWED
    assert profile.step_spread_for(2) == SKEWED  # nearer 1 than 4
    assert profile.step_spread_for(3)[0] == (0.0, 2.0)
    assert profile.step_spread_for(9)[0] == (0.0, 2.0)
    # JSON round trip (keys become strings on the way).
    loaded = EngineProfile.model_validate_json(profile.model_dump_json())
    assert loaded.step_spread_for(4) == [(0.0, 2.0), (1.0, 2.0)]
    # A constant 2x step spread doubles every decode step of a lone sequence.
    slow = PROFILE.model_copy(update={"step_spread": {1: [(0.0, 2.0), (1.0, 2.0)]}})
    loop = EventLoop()
    rec = Recorder()
    inst = Instance("i", "edge", "a", slow, loop, rec)
    inst.submit(Job(SimRequest(0, "a", 0.0, 100, 11, False), rtt=0.0))
    loop.run()
    assert rec.finished[0] == pytest.approx(0.1 + 10 * 0.020)
