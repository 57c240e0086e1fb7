"""Sizing for cost at SLO, the geography presets, ShareGPT-shaped workloads and
the rounding of what the simulator prints."""

from __future__ import annotations

import json
import random
import re
from collections.abc import Iterator
from pathlib import Path

import pytest

from hybrid_llm.cli import main
from hybrid_llm.fleet.sim import (
    CenterSpec,
    EngineProfile,
    Instance,
    RegionSpec,
    SimConfig,
    Simulation,
    Sizer,
    Slo,
    WorkloadSpec,
    fleet_price,
    summarize_result,
    tidy,
)
from hybrid_llm.fleet.sim.config import LengthDist
from hybrid_llm.fleet.sim.events import EventLoop
from hybrid_llm.fleet.sim.report import fmt_ms
from hybrid_llm.fleet.sim.request import Job, SimRequest
from servekit.config import load_settings

DEPLOY = Path(__file__).resolve().parents[2] / "deploy" / "sim"

EDGE = EngineProfile(
    prefill_tokens_per_s=2000,
    decode_base_ms=20,
    decode_per_seq_ms=2,
    slots=2,
    queue_limit=8,
    gpus=1,
    gpu_kind="L4",
)
CENTER = EngineProfile(
    prefill_tokens_per_s=5000,
    decode_base_ms=10,
    decode_per_seq_ms=1,
    slots=4,
    queue_limit=64,
    gpus=2,
    gpu_kind="H100",
)
SLO = Slo(p99_ms=250, p95_ms=150)


def _config(**kw: object) -> SimConfig:
    base: dict[str, object] = {
        "rtt": {"rtt_ms": {"a": {"c": 60}, "b": {"c": 60}}, "same_region_ms": 2},
        "regions": [RegionSpec(name="a", rate=5), RegionSpec(name="b", rate=5)],
        "edge_profile": EDGE,
        "center": CenterSpec(region="c", profile=CENTER),
        "workload": WorkloadSpec(
            prompt_tokens=LengthDist(kind="fixed", value=100),
            output_tokens=LengthDist(kind="fixed", value=40),
            hard_fraction=0.2,
        ),
        "gpu_hour_usd": {"L4": 1.0, "H100": 10.0},
        "duration_s": 30,
        "warmup_s": 2,
        "seed": 3,
    }
    base.update(kw)
    return SimConfig.model_validate(base)


def _p(summary: dict[str, object], q: str) -> float:
    value = summary["same_city"]["ttft_ms"][q]  # type: ignore[index]
    assert isinstance(value, float)
    return value


def _simulate(config: SimConfig, policy: str, edges: int, replicas: int) -> dict[str, object]:
    """One run of that fleet, built here rather than through the sizer."""
    regions = [r.model_copy(update={"edges": edges}) for r in config.regions]
    cfg = config.model_copy(
        update={
            "regions": regions,
            "center": config.center.model_copy(update={"replicas": replicas}),
            "policy": config.policy.model_copy(update={"name": policy}),
        }
    )
    return summarize_result(Simulation(cfg).run())


def _meets(summary: dict[str, object]) -> bool:
    on_edges = summary["hard"]["on_edges"]  # type: ignore[index]
    return _p(summary, "p99") < 250 and _p(summary, "p95") < 150 and on_edges <= 0.05


def test_all_center_sizing_is_the_fewest_replicas_meeting_the_slo() -> None:
    config = _config()
    out = Sizer(config, 10.0, SLO).size("all-center", 16, 16)
    assert out["feasible"]
    fleet = out["result"]["fleet"]
    replicas = fleet["center_replicas"]
    assert fleet["edges"] == 0
    assert 1 < replicas < 16
    assert _meets(_simulate(config, "all-center", 0, replicas))
    assert not _meets(_simulate(config, "all-center", 0, replicas - 1))
    # Priced by hand: replicas x 2 GPUs x $10.
    assert fleet["usd_per_hour"] == pytest.approx(replicas * 2 * 10.0)


def test_hybrid_sizing_meets_the_slo_and_one_edge_fewer_does_not() -> None:
    config = _config()
    sizer = Sizer(config, 10.0, SLO)
    out = sizer.size("hybrid", 16, 16)
    assert out["feasible"]
    fleet = out["result"]["fleet"]
    edges, replicas = fleet["edges_per_region"], fleet["center_replicas"]
    assert edges > 1
    assert _meets(_simulate(config, "hybrid", edges, replicas))
    assert not _meets(_simulate(config, "hybrid", edges - 1, replicas))
    assert fleet["usd_per_hour"] == pytest.approx(2 * edges * 1.0 + replicas * 2 * 10.0)
    # Cheapest among what it probed: every meeting fleet costs at least as much.
    meeting = [s["fleet"]["usd_per_hour"] for s in sizer.probes.values() if s["ok"]]
    assert min(meeting) == pytest.approx(fleet["usd_per_hour"])


def test_an_unreachable_slo_is_reported_not_invented() -> None:
    # 60 ms away and 100 tokens to prefill: no center fleet gets under 50 ms.
    out = Sizer(_config(), 10.0, Slo(p99_ms=50)).size("all-center", 16, 4)
    assert not out["feasible"]
    assert out["result"] is None


def test_a_starved_center_does_not_pass_by_pushing_hard_requests_to_edges() -> None:
    # One single-slot replica that refuses when busy: hard requests fall back to edges.
    tiny = CENTER.model_copy(update={"slots": 1, "queue_limit": 0})
    summary = _simulate(_config(center=CenterSpec(region="c", profile=tiny)), "hybrid", 8, 1)
    assert summary["hard"]["on_edges"] > 0.1  # type: ignore[index]
    assert Slo(p99_ms=None).met(summary) is False
    assert Slo(p99_ms=None, hard_on_edges=1.0).met(summary) is True
    slow = Slo(p99_ms=None, hard_on_edges=1.0, hard_p99_ms=1.0)
    assert slow.met(summary) is False


def test_a_gpu_without_a_price_is_named() -> None:
    config = _config(gpu_hour_usd={"L4": 1.0})
    assert fleet_price(config, 1, 1)["usd_per_hour"] is None
    with pytest.raises(ValueError, match="H100"):
        Sizer(config, 10.0, SLO).size("all-center", 4, 4)


@pytest.mark.parametrize(
    ("name", "low", "high"),
    [("national", 8, 54), ("continental", 60, 150), ("intercontinental", 150, 300)],
)
def test_geography_presets_load_and_keep_their_center_distances(
    name: str, low: float, high: float
) -> None:
    config = load_settings(SimConfig, DEPLOY / f"geo-{name}.yaml")
    center = config.center.region
    away = [config.rtt.rtt(r.name, center) for r in config.regions if r.name != center]
    assert away
    assert low <= min(away)
    assert max(away) <= high
    assert config.edge.gpu_kind in config.gpu_hour_usd
    assert config.center_profile.gpu_kind in config.gpu_hour_usd
    wl = config.workload
    assert 0 < wl.hard_fraction < 1
    assert wl.history_tokens is not None
    assert wl.followup_share > 0


def test_every_sim_preset_validates() -> None:
    presets = sorted(DEPLOY.glob("*.yaml"))
    assert len(presets) >= 6
    for path in presets:
        load_settings(SimConfig, path)


def test_length_quantiles_are_drawn_by_inverse_cdf() -> None:
    dist = LengthDist(kind="quantiles", quantiles=[(0, 10), (0.5, 20), (0.9, 100), (1, 1000)])
    rng = random.Random(5)
    draws = sorted(dist.sample(rng) for _ in range(4000))
    assert draws[0] >= 10
    assert draws[-1] <= 1000
    assert draws[2000] == pytest.approx(20, abs=2)
    assert draws[3000] == pytest.approx(70, abs=6)  # a quarter into 20..100 at q 0.5..0.9
    # Trapezoid over the CDF: 0.5 * 15 + 0.4 * 60 + 0.1 * 550.
    assert dist.mean() == pytest.approx(86.5)
    with pytest.raises(ValueError, match="rising q"):
        LengthDist(kind="quantiles", quantiles=[(0.1, 10), (1, 20)])
    with pytest.raises(ValueError, match="non-decreasing"):
        LengthDist(kind="quantiles", quantiles=[(0, 30), (1, 20)])


class _Recorder:
    def __init__(self) -> None:
        self.first: dict[int, float] = {}

    def first_token(self, job: Job, now: float) -> None:
        self.first[job.req.id] = now

    def done(self, job: Job, now: float) -> None:
        return None


def test_a_follow_up_prefills_only_its_new_tokens() -> None:
    loop = EventLoop()
    rec = _Recorder()
    inst = Instance(
        "i", "edge", "a", EngineProfile(prefill_tokens_per_s=1000, decode_base_ms=10), loop, rec
    )
    follow_up = SimRequest(0, "a", 0.0, 1100, 5, False, cached_tokens=1000, history_tokens=1000)
    assert inst.submit(Job(follow_up, rtt=0.0))
    loop.run()
    assert rec.first[0] == pytest.approx(0.1)  # 100 new tokens at 1000/s


def test_follow_ups_carry_history_in_their_prompt_and_cache() -> None:
    config = _config(
        workload=WorkloadSpec(
            prompt_tokens=LengthDist(kind="fixed", value=50),
            history_tokens=LengthDist(kind="fixed", value=700),
            followup_share=0.5,
            output_tokens=LengthDist(kind="fixed", value=10),
        ),
        regions=[RegionSpec(name="a", edges=2, rate=5)],
    )
    reqs = Simulation(config).run().requests
    follow = [r for r in reqs if r.history_tokens]
    assert 0.3 < len(follow) / len(reqs) < 0.7
    assert all(r.prompt_tokens == 750 and r.cached_tokens == 700 for r in follow)
    assert all(r.prompt_tokens == 50 and r.cached_tokens == 0 for r in reqs if not r.history_tokens)


def test_figures_are_rounded_to_what_they_mean() -> None:
    assert fmt_ms(102.67059421604452) == "103"
    assert fmt_ms(12.3456) == "12.3"
    assert fmt_ms(None) == "-"
    assert tidy({"a": [102.67059421604452, 0.000123456], "b": 3}) == {
        "a": [102.7, 0.0001235],
        "b": 3,
    }


def _floats(value: object) -> Iterator[float]:
    if isinstance(value, float):
        yield value
    elif isinstance(value, dict):
        for v in value.values():
            yield from _floats(v)
    elif isinstance(value, list):
        for v in value:
            yield from _floats(v)


def test_size_command_prints_tidy_figures_and_the_ratio(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = _config()
    path = tmp_path / "sim.yaml"
    path.write_text(json.dumps(config.model_dump(mode="json")), encoding="utf-8")
    report = tmp_path / "out.json"
    argv = ["simulate", "--config", str(path), "--size", "--slo-ms", "250"]
    argv += ["--slo-p95-ms", "150", "--max-edges", "8", "--max-replicas", "8"]
    argv += ["--gpu-price", "H100=20", "--json", str(report)]
    assert main(argv) == 0
    printed = capsys.readouterr().out
    assert "vs all-center" in printed
    assert not re.search(r"\d\.\d{5,}", printed)
    data = json.loads(report.read_text(encoding="utf-8"))
    floats = list(_floats(data))
    assert len(floats) > 50
    assert all(len(f"{abs(x):e}".split("e")[0].replace(".", "").rstrip("0")) <= 4 for x in floats)
    rows = {r["policy"]: r for r in data["rows"]}
    assert rows["all-center"]["vs_all_center"] == 1.0
    hybrid = rows["hybrid"]
    priced = 2 * hybrid["edges_per_region"] * 1.0 + hybrid["center_replicas"] * 2 * 20.0
    assert hybrid["usd_per_hour"] == pytest.approx(priced)
    assert hybrid["vs_all_center"] == pytest.approx(
        priced / rows["all-center"]["usd_per_hour"], rel=1e-3
    )
    assert main([*argv[:-4], "--gpu-price", "H100"]) == 2
