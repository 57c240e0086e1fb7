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
from hybrid_llm.fleet.sim import EngineProfile, RegionSpec
from hybrid_llm.fleet.sim.config import TracedRequest
from hybrid_llm.fleet.simcheck import compare, mean_profile, sim_config, simulate
from hybrid_llm.fleet.simcheck.measure import bench_source
from hybrid_llm.fleet.simcheck.replay import bench_trace

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
    assert set(first) == {"sim (bench requests)", "sim (Poisson)"}
    for name, runs in first.items():
        reqs = [r for run in runs for r in run]
        assert [r.ttft for r in reqs] == [r.ttft for run in second[name] for r in run]
        assert len({round(r.ttft or 0, 9) for r in reqs}) > 10  # drawn, not all alike
    assert len(first["sim (bench requests)"]) == 14  # replays of the bench's 30 requests
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
    assert "sim (bench requests)" in out
    assert "TTFT p99" in out


def _conversation_measurement() -> dict[str, object]:
    """A customer-service-like run: every request 480 prompt tokens, all but the
    first with the 460-token system prompt cached; half the answers 2 tokens, half
    30; requests 5 s apart (never two at once)."""
    records = []
    for i in range(20):
        rec = RequestRecord(start=5.0 * i, bucket="customer-service", ok=True, ttft=0.3, e2e=1.0)
        rec.prompt_tokens, rec.cached_tokens = 480, (25 if i == 0 else 460)
        rec.output_tokens = 2 if i % 2 else 30
        records.append(rec.to_dict())
    profile = EngineProfile(
        prefill_tokens_per_s=100,
        decode_base_ms=20,
        slots=4,
        prefill_points=[(25, 0.05), (45, 0.15), (460, 4.0), (480, 4.25)],
    )
    return {
        "profile": profile.model_dump(),
        "path_ms": 0.0,
        "preamble_tokens": 25,
        "warm": {},
        "records": records,
    }


def test_the_simulation_replays_each_request_with_its_own_lengths() -> None:
    args = _args()
    args.workload = "customer-service"
    sims = simulate(args, _conversation_measurement())
    assert set(sims) == {"sim (bench requests)"}  # no Poisson draw of conversation lengths
    reqs = [r for run in sims["sim (bench requests)"] for r in run]
    assert len(reqs) >= 400
    # Each request's own cache hit: one cold prefill per replay, the rest after the
    # cached system prompt (the mean cached, 438.25, would make them all alike).
    ttfts = sorted(round(r.ttft or 0.0, 3) for r in reqs)
    rtt = 0.004  # user -> router and router -> edge, 2 ms each way and back
    assert ttfts[0] == pytest.approx(4.25 - 4.0 + 0.05 + rtt, abs=1e-3)
    assert ttfts[-1] == pytest.approx(4.25 + rtt, abs=1e-3)
    assert sum(t > 1.0 for t in ttfts) == len(reqs) // 20
    # Each request's own answer length (the mean, 16, would give one E2E for all).
    tpots = {round(r.tpot or 0.0, 4) for r in reqs}
    assert tpots == {0.02}
    e2e = sorted(r.e2e or 0.0 for r in reqs if (r.ttft or 0.0) < 1.0)
    assert e2e[0] == pytest.approx(ttfts[0] + 0.02, abs=1e-3)
    assert e2e[-1] == pytest.approx(ttfts[0] + 29 * 0.02, abs=1e-3)


def test_a_trace_gives_lengths_or_plain_arrivals_not_both() -> None:
    with pytest.raises(ValueError, match="arrivals or trace"):
        RegionSpec(
            name="a",
            arrivals=[1.0],
            trace=[TracedRequest(at=1.0, prompt_tokens=40, output_tokens=4)],
        )


def test_the_subcommand_takes_a_workload_and_replays_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    saved = tmp_path / "svb.json"
    args = vars(_args()) | {"workload": "customer-service", "max_tokens": 16}
    measured = {**_conversation_measurement(), "load_start": 0.5, "args": args}
    saved.write_text(json.dumps(measured), encoding="utf-8")
    assert main(["simcheck", "--replay", str(saved)]) == 0
    out = capsys.readouterr().out
    assert "sim (bench requests)" in out
    assert "Poisson" not in out
    assert "city TTFT p99" in out
    with pytest.raises(SystemExit):
        main(["simcheck", "--workload", "chat", "--dataset", str(saved)])


def test_the_trace_keeps_each_requests_route_judgement_and_lengths() -> None:
    records = _conversation_measurement()["records"]
    assert isinstance(records, list)
    records[3] = records[3] | {"tier": "center", "region": "center", "reason": "hard"}
    records[4] = records[4] | {"tier": "center", "region": "center", "reason": "spill-center"}
    trace = bench_trace(records)
    assert [t["hard"] for t in trace].count(True) == 1
    assert trace[3]["hard"]
    assert [t["cached_tokens"] for t in trace[:2]] == [25, 460]
    assert [t["output_tokens"] for t in trace[:2]] == [30, 2]


def test_later_turns_continue_the_conversation_whose_answer_just_arrived() -> None:
    def rec(start: float, turn: int, e2e: float) -> dict[str, object]:
        r = RequestRecord(start=start, bucket="chat", ok=True, ttft=0.1, e2e=e2e, turn=turn)
        r.prompt_tokens, r.cached_tokens, r.output_tokens = 40 + 30 * turn, 25, 16
        return r.to_dict()

    # Two conversations interleaved: A opens at 0, B at 0.5; A's answers take
    # 1 s, B's 0.2 s, so B's second turn comes before A's.
    records = [rec(0.0, 0, 1.0), rec(0.5, 0, 0.2), rec(0.7, 1, 0.2), rec(1.0, 1, 1.0)]
    records.append(rec(2.0, 2, 0.5))  # A's third turn
    trace = bench_trace(records, preamble=25)
    names = [t["conversation"] for t in trace]
    assert names[0] != names[1]
    assert names[2:] == [names[1], names[0], names[0]]
    # A first turn's cached prefix is its workload's system prompt, a later one's
    # its conversation's history (held only where that conversation was served).
    assert [t["prefix"] for t in trace] == ["chat", "chat", names[1], names[0], names[0]]


def test_only_a_shared_system_prompt_fills_a_cold_first_turn() -> None:
    shared = _conversation_measurement()["records"]
    assert isinstance(shared, list)
    # The cold first request carries the system prompt's 460 tokens: the simulated
    # instance it lands on decides whether they are cached.
    assert bench_trace(shared, preamble=25)[0]["cached_tokens"] == 460
    # A dataset's prompts share nothing but the preamble; one repeat found its own.
    dataset = [r | {"bucket": "dataset", "cached_tokens": 25} for r in shared]
    dataset[5] = dataset[5] | {"cached_tokens": 300}
    assert [t["cached_tokens"] for t in bench_trace(dataset, preamble=25)[:6]] == [25] * 5 + [300]


def test_a_later_turn_is_sent_when_the_simulated_answer_before_it_arrives() -> None:
    # The bench's second turn started at 1.2 s, 0.1 s after its first answer; the
    # simulated first answer takes longer (a 4 s prefill): the turn waits for it,
    # as the client did, instead of overlapping its own previous turn.
    measured = _conversation_measurement()
    records = measured["records"]
    assert isinstance(records, list)
    first = records[0] | {"bucket": "chat", "start": 0.0, "e2e": 1.1, "turn": 0}
    second = records[1] | {"bucket": "chat", "start": 1.2, "e2e": 0.5, "turn": 1}
    trace = bench_trace([first, second], preamble=25)
    assert trace[1]["follows"] == 0
    assert trace[1]["gap_s"] == pytest.approx(0.1)
    args = _args()
    args.workload = "chat"
    sims = simulate(args, measured | {"records": [first, second]})
    for run in sims["sim (bench requests)"]:
        a, b = sorted(run, key=lambda r: r.arrival)
        assert a.e2e is not None
        assert a.e2e > 4.0
        assert b.arrival == pytest.approx(a.arrival + a.e2e + 0.1)


def test_the_bench_sends_a_dataset_a_workload_or_the_bucket(tmp_path: Path) -> None:
    data = tmp_path / "chats.jsonl"
    data.write_text(json.dumps({"messages": [{"role": "user", "content": "hi"}]}) + "\n")
    args = _args()
    assert bench_source(args).conversation().label == "8:16"
    args.workload, args.max_tokens = "customer-service", 12
    assert bench_source(args).conversation().label == "customer-service"
    args.dataset = data
    source = bench_source(args)
    conv = source.conversation()
    assert conv.label == "dataset"
    assert source.request_body([{"role": "user", "content": "hi"}], None)["max_tokens"] == 12
