"""The fleet simulator: engine model against hand-computed timings, policies
against each other on small fleets, and the sizing search."""

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
    WorkloadSpec,
    size_edges,
    summarize_result,
)
from hybrid_llm.fleet.sim.config import LengthDist
from hybrid_llm.fleet.sim.events import EventLoop
from hybrid_llm.fleet.sim.request import Job, SimRequest
from tests.support.sim import Recorder, sim_job

PROFILE = EngineProfile(
    prefill_tokens_per_s=1000, decode_base_ms=10, decode_per_seq_ms=5, slots=2, queue_limit=1
)


def _instance(profile: EngineProfile = PROFILE) -> tuple[EventLoop, Instance, Recorder]:
    loop = EventLoop()
    rec = Recorder()
    return loop, Instance("i", "edge", "a", profile, loop, rec), rec


def test_prefill_is_serial_and_decoders_ride_along() -> None:
    loop, inst, rec = _instance()
    jobs = [sim_job(0), sim_job(1)]
    for job in jobs:
        assert inst.submit(job)
    loop.run()
    # Prefill 100 tokens at 1000/s each, one after the other; the first, decoding by
    # then, rides along in the second's prefill step: +5 ms, and one token for it.
    assert rec.first[0] == pytest.approx(0.1)
    assert rec.first[1] == pytest.approx(0.205)
    # From 0.205 both decode at 10 + 5 ms per step: the first has 9 tokens left,
    # the second 10 (its last one alone at 10 ms).
    assert rec.finished[0] == pytest.approx(0.205 + 9 * 0.015)
    assert rec.finished[1] == pytest.approx(0.205 + 9 * 0.015 + 0.010)
    assert inst.used == 0
    assert inst.busy == pytest.approx(0.35)


def test_full_slots_queue_then_429() -> None:
    loop, inst, rec = _instance()
    jobs = [sim_job(i, output=1) for i in range(4)]
    assert [inst.submit(j) for j in jobs] == [True, True, True, False]
    report = inst.report()  # what its /load says: slots in use, and one waiting for a slot
    assert (report.running, report.waiting, report.capacity) == (2, 1, 2)
    loop.run()
    # One-token answers finish at their first token; the waiting one starts after.
    assert [rec.first[i] for i in range(3)] == pytest.approx([0.1, 0.2, 0.3])
    assert 3 not in rec.first


def test_cancel_frees_the_slot_for_the_next() -> None:
    loop, inst, rec = _instance(PROFILE.model_copy(update={"slots": 1}))
    a, b = sim_job(0), sim_job(1, output=1)
    inst.submit(a)
    inst.submit(b)
    loop.at(0.05, inst.cancel, a)
    loop.run()
    assert 0 not in rec.first
    assert rec.first[1] == pytest.approx(0.15)


def _config(**kw: object) -> SimConfig:
    base: dict[str, object] = {
        "rtt": {"rtt_ms": {"a": {"c": 80}, "b": {"c": 60}}, "same_region_ms": 2},
        "regions": [RegionSpec(name="a", edges=4, rate=6), RegionSpec(name="b", edges=4, rate=6)],
        "edge_profile": EngineProfile(
            prefill_tokens_per_s=8000, decode_base_ms=20, decode_per_seq_ms=1, slots=4
        ),
        "center": CenterSpec(region="c", replicas=2, profile="h100x4-llama70b-fp8"),
        "workload": WorkloadSpec(
            prompt_tokens=LengthDist(kind="uniform", low=50, high=150),
            output_tokens=LengthDist(kind="fixed", value=40),
            hard_fraction=0.2,
        ),
        "duration_s": 40,
        "warmup_s": 2,
        "seed": 7,
    }
    base.update(kw)
    return SimConfig.model_validate(base)


def _run(config: SimConfig, policy: str) -> dict[str, object]:
    spec = config.policy.model_copy(update={"name": policy})
    return summarize_result(Simulation(config.model_copy(update={"policy": spec})).run())


def test_hybrid_beats_all_to_center_for_same_city_users() -> None:
    config = _config()
    center, hybrid = _run(config, "all-center"), _run(config, "hybrid")
    c99 = center["same_city"]["ttft_ms"]["p99"]  # type: ignore[index]
    h99 = hybrid["same_city"]["ttft_ms"]["p99"]  # type: ignore[index]
    # The center is 60-80 ms away; edges are 2 ms away.
    assert c99 > 60
    assert h99 < c99 / 2
    assert hybrid["failed"] == 0
    assert hybrid["unfinished"] == 0
    assert set(hybrid["by_tier"]) == {"edge", "center"}  # type: ignore[arg-type]
    tiers = hybrid["tiers"]
    assert tiers["edge"]["gpus"] == 8  # type: ignore[index]
    assert tiers["center"]["gpus"] == 8  # type: ignore[index]
    assert 0 < tiers["edge"]["occupancy"] < 1  # type: ignore[index]


def test_hedging_races_slow_edges_and_never_loses_requests() -> None:
    # One slow single-slot edge per region: queues build, hedges fire.
    slow = EngineProfile(prefill_tokens_per_s=500, decode_base_ms=30, slots=1, queue_limit=8)
    config = _config(
        edge_profile=slow,
        regions=[RegionSpec(name="a", edges=1, rate=1.5)],
        # Keep simple requests on the edge even when it queues, so hedges must fire.
        policy=PolicySpec(hedge_after_ms=200, router={"center_bias_ms": 5000}),
    )
    plain, hedged = _run(config, "hybrid"), _run(config, "hybrid-hedge")
    assert hedged["hedged"] > 0  # type: ignore[operator]
    assert hedged["failed"] == 0
    assert hedged["unfinished"] == 0
    p99_plain = plain["same_city"]["ttft_ms"]["p99"]  # type: ignore[index]
    p99_hedged = hedged["same_city"]["ttft_ms"]["p99"]  # type: ignore[index]
    assert p99_hedged < p99_plain


def test_sizing_finds_the_smallest_edge_count_meeting_the_slo() -> None:
    config = _config(
        workload=WorkloadSpec(
            prompt_tokens=LengthDist(kind="fixed", value=100),
            output_tokens=LengthDist(kind="fixed", value=40),
            hard_fraction=0.0,
        ),
        # A center this far cannot absorb the overflow within the SLO.
        rtt={"default_ms": 300, "same_region_ms": 2},
        duration_s=30,
    )
    out = size_edges(config, 20.0, slo_ms=200, max_edges=16)
    assert out["feasible"]
    n = out["edges_per_region"]
    assert 1 < n < 16
    assert out["result"]["same_city"]["ttft_ms"]["p99"] < 200
    fewer = size_edges(config, 20.0, slo_ms=200, max_edges=n - 1)
    assert not fewer["feasible"]


def test_config_errors_name_the_problem() -> None:
    with pytest.raises(ValueError, match="unknown engine profile"):
        _config(edge_profile="tpu-v9")
    with pytest.raises(ValueError, match="warmup_s"):
        _config(warmup_s=50)


def test_measured_prefill_points_are_interpolated() -> None:
    profile = PROFILE.model_copy(update={"prefill_points": [(100, 0.5), (50, 0.2), (200, 1.5)]})
    profile = EngineProfile.model_validate(profile.model_dump())
    assert profile.prefill_s(50) == pytest.approx(0.2)
    assert profile.prefill_s(75) == pytest.approx(0.35)
    assert profile.prefill_s(150) == pytest.approx(1.0)
    assert profile.prefill_s(250) == pytest.approx(2.0)  # the last slope continues
    assert profile.prefill_s(25) == pytest.approx(0.05)  # and the first one below
    assert PROFILE.prefill_s(100) == pytest.approx(0.1)  # no points: the rate


def test_cached_tokens_come_off_at_the_price_of_their_position() -> None:
    # Cost per token grows with the context, as llama.cpp's on a CPU: the profile's
    # prompts found 25 tokens (the template's preamble) cached.
    points = [(25, 0.05), (45, 0.15), (460, 4.0), (480, 4.25)]
    loop, inst, rec = _instance(PROFILE.model_copy(update={"prefill_points": points}))
    system = SimRequest(0, "a", 0.0, 480, 1, False, cached_tokens=460, preamble_tokens=25)
    fresh = SimRequest(1, "a", 0.0, 480, 1, False, cached_tokens=25, preamble_tokens=25)
    cold = SimRequest(2, "a", 0.0, 480, 1, False, cached_tokens=0, preamble_tokens=25)
    for at, req in ((0.0, system), (10.0, fresh), (20.0, cold)):
        loop.at(at, inst.submit, Job(req, rtt=0.0))
    loop.run()
    # The 20 tokens after a cached 460-token system prompt cost what the profile's
    # 460 -> 480 stretch does, plus the overhead its shortest prompts carry:
    # T(480) - T(460) + T(25), not T(45) (20 tokens at the start of a prompt).
    assert rec.first[0] == pytest.approx(4.25 - 4.0 + 0.05)
    assert rec.first[1] == pytest.approx(10 + 4.25)  # the profile's own case: T(480)
    # Nothing cached: the preamble's 25 tokens are computed too.
    assert rec.first[2] == pytest.approx(20 + 4.25 + 0.05)
