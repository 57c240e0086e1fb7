"""The simulator check (``hybrid_llm.fleet.simcheck``, ``hybrid-llm simcheck``) on a
synthetic measurement: merging the two profiles, the simulated fleet it builds,
seeded reproducibility and the report."""

from __future__ import annotations

import argparse
import json
import random
from pathlib import Path

import pytest

from hybrid_llm.bench.client import RequestRecord
from hybrid_llm.cli import main
from hybrid_llm.fleet.sim import EngineProfile
from hybrid_llm.fleet.simcheck import compare, mean_profile, sim_config, simulate

BEFORE = EngineProfile(
    prefill_tokens_per_s=200,
    decode_base_ms=30,
    decode_per_seq_ms=10,
    slots=4,
    prefill_points=[(40, 0.10), (80, 0.30)],
    mixed_points=[(1, 0.02), (2, 0.05)],
    prefill_spread=[(0.0, 0.9), (0.5, 1.0), (1.0, 1.6)],
    step_spread={1: [(0.0, 0.8), (0.5, 1.0), (1.0, 1.4)]},
)
AFTER = BEFORE.model_copy(
    update={
        "decode_base_ms": 40,
        "prefill_points": [(40, 0.14), (100, 0.5)],
        "mixed_points": [(1, 0.04)],
        "prefill_spread": [(0.0, 0.7), (0.5, 1.0), (1.0, 2.0)],
        "step_spread": {2: [(0.0, 0.5), (0.5, 1.0), (1.0, 3.0)]},
    }
)


def test_mean_profile_merges_mixed_steps_and_spreads() -> None:
    mean = mean_profile(BEFORE, AFTER)
    assert mean.decode_base_ms == 35
    assert mean.prefill_points == [(40, pytest.approx(0.12)), (80, 0.30), (100, 0.5)]
    assert mean.mixed_points == [(1, pytest.approx(0.03)), (2, 0.05)]
    assert mean.prefill_spread == [(0.0, pytest.approx(0.8)), (0.5, 1.0), (1.0, 1.8)]
    assert set(mean.step_spread) == {1, 2}  # each batch size from whichever measured it


def _measured(n: int = 30) -> dict[str, object]:
    rng = random.Random(5)
    records = []
    t = 0.0
    for _ in range(n):
        t += rng.expovariate(1.0)
        ttft = 0.12 * rng.choice([0.9, 1.0, 1.0, 1.1, 1.8])
        rec = RequestRecord(start=t, bucket="8:16", ok=True, ttft=ttft, e2e=ttft + 15 * 0.03)
        rec.output_tokens, rec.prompt_tokens, rec.cached_tokens = 16, 45, 25
        records.append(rec.to_dict())
    profile = mean_profile(BEFORE, AFTER)
    return {"profile": profile.model_dump(), "path_ms": 3.0, "warm": {}, "records": records}


def _args() -> argparse.Namespace:
    return argparse.Namespace(
        sim_config=None,
        edge_only=True,
        rtt_ms=2.0,
        rate=1.0,
        duration=30.0,
        bucket="8:16",
        model="edge",
        chunk_tokens=128,
    )


def test_the_simulated_fleet_is_the_measured_one() -> None:
    config = sim_config(_args(), _measured())
    profile = EngineProfile.model_validate(config["edge_profile"])
    assert profile.chunk_tokens == 128
    assert profile.mixed_points == [(1, pytest.approx(0.03)), (2, 0.05)]
    assert profile.prefill_spread
    assert profile.step_spread
    assert config["workload"]["prompt_tokens"]["value"] == 45
    assert config["workload"]["cached_prefix_tokens"] == 25
    assert config["policy"]["router_overhead_ms"] == 3.0


def test_simulations_are_seeded_and_the_report_compares_them(
    capsys: pytest.CaptureFixture[str],
) -> None:
    measured = _measured()
    first = simulate(_args(), measured)
    second = simulate(_args(), measured)
    assert set(first) == {"sim (bench arrivals)", "sim (Poisson)"}
    for name, reqs in first.items():
        assert [r.ttft for r in reqs] == [r.ttft for r in second[name]]
        assert len({round(r.ttft or 0, 9) for r in reqs}) > 10  # drawn, not all alike
    compare(measured["records"], first)  # type: ignore[arg-type]
    out = capsys.readouterr().out
    assert "TTFT p99" in out
    assert "direct" in out  # no router headers: every request straight to the engine


def test_the_subcommand_replays_a_saved_measurement(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    measured = {**_measured(), "load_start": 0.5, "args": vars(_args())}
    saved = tmp_path / "svb.json"
    saved.write_text(json.dumps(measured), encoding="utf-8")
    assert main(["simcheck", "--replay", str(saved)]) == 0
    out = capsys.readouterr().out
    assert f"replaying {saved} (measured at load 0.5)" in out
    assert "sim (bench arrivals)" in out
    assert "TTFT p99" in out
