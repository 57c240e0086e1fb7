"""Does the simulator predict what the bench measures? One run, both numbers.

    # a single edge behind a delay proxy (hybrid-llm netem), no router:
    python bench/sim_vs_bench.py --engine-url http://127.0.0.1:8101 \
        --bench-url http://127.0.0.1:9101 --rtt-ms 2 --edge-only --rate 1 --duration 60
    # the local topology through the router (hybrid-llm up --netem):
    python bench/sim_vs_bench.py --engine-url http://127.0.0.1:8101 \
        --bench-url http://127.0.0.1:8080 --sim-config configs/local-sim.yaml --rate 1

1. measures the engine profile at ``--engine-url`` (``hybrid-llm profile``);
2. drives Poisson load at ``--bench-url`` (``hybrid-llm bench --rate``);
3. simulates the same fleet, profile, rate and measured prompt/output lengths;
4. prints TTFT percentiles from both and the difference.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time
from pathlib import Path
from typing import Any

from hybrid_llm.bench import (
    LoadStep,
    RequestRecord,
    RunPlan,
    Variant,
    Workload,
    parse_bucket,
    run_plan,
)
from hybrid_llm.bench.stats import percentile
from hybrid_llm.profile import measure_profile
from hybrid_llm.sim import EngineProfile, SimConfig, Simulation, summarize_result
from servekit.config import load_settings


def _edge_only(rtt_ms: float, rate: float) -> dict[str, Any]:
    return {
        # The center is unreachable in time, so every request stays on the edge.
        "rtt": {"same_region_ms": rtt_ms, "rtt_ms": {"a": {"far": 100_000}}},
        "regions": [{"name": "a", "edges": 1, "rate": rate}],
        "center": {"region": "far", "replicas": 1},
        "workload": {"hard_fraction": 0.0},
    }


async def _ttfts(url: str, model: str, args: argparse.Namespace, n: int) -> list[RequestRecord]:
    plan = RunPlan(
        url=url,
        workload=Workload(model, [parse_bucket(args.bucket)]),
        steps=[LoadStep("concurrency", 1)],
        variants=[Variant("path")],
        duration=600,
        max_requests=n,
    )
    return [r for r in (await run_plan(plan))[0].records if r.ok and r.ttft is not None]


async def _path_overhead_ms(args: argparse.Namespace, region: str | None, n: int = 8) -> float:
    """Median TTFT through ``--bench-url`` (same-city routes only) minus direct,
    minus the same-city RTT the simulator adds itself."""
    engine = await _ttfts(args.engine_url, args.engine_model, args, n)
    direct = [r.ttft for r in engine if r.ttft is not None]
    routed = await _ttfts(args.bench_url, args.model, args, 2 * n)
    same_city = [r.ttft for r in routed if r.ttft is not None and region in (None, r.region)]
    overhead = (statistics.median(same_city) - statistics.median(direct)) * 1000 - args.rtt_ms
    print(
        f"path: direct TTFT p50 {statistics.median(direct) * 1000:.1f} ms, through "
        f"{args.bench_url} (same city) {statistics.median(same_city) * 1000:.1f} ms: "
        f"{overhead:.1f} ms added beyond the RTT"
    )
    return overhead


async def _profile(url: str, lengths: list[int], repeats: int) -> EngineProfile:
    t0 = time.perf_counter()
    measured = await measure_profile(url, prompt_lengths=lengths, repeats=repeats)
    profile: EngineProfile = measured["profile"]
    points = ", ".join(f"{x:.0f}:{y * 1000:.0f}" for x, y in profile.prefill_points)
    print(
        f"profile ({time.perf_counter() - t0:.0f}s): TTFT by prompt tokens (ms) {points}; "
        f"decode step {profile.decode_base_ms:.1f} ms, slots {profile.slots}"
    )
    return profile


def _mean_profile(a: EngineProfile, b: EngineProfile) -> EngineProfile:
    by_tokens: dict[int, list[float]] = {}
    for x, y in [*a.prefill_points, *b.prefill_points]:
        by_tokens.setdefault(x, []).append(y)
    return a.model_copy(
        update={
            "decode_base_ms": (a.decode_base_ms + b.decode_base_ms) / 2,
            "decode_per_seq_ms": (a.decode_per_seq_ms + b.decode_per_seq_ms) / 2,
            "prefill_points": sorted((x, statistics.mean(ys)) for x, ys in by_tokens.items()),
        }
    )


async def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--engine-url", required=True, help="an edge agent, for the profile")
    p.add_argument("--bench-url", required=True, help="what users hit (proxy or router)")
    p.add_argument("--sim-config", type=Path, help="fleet to simulate (default: --edge-only)")
    p.add_argument("--edge-only", action="store_true")
    p.add_argument("--rtt-ms", type=float, default=2.0, help="--edge-only: user<->edge RTT")
    p.add_argument("--rate", type=float, default=1.0)
    p.add_argument("--duration", type=float, default=60.0)
    p.add_argument("--bucket", default="48:24")
    p.add_argument("--model", default="auto", help="model sent to --bench-url")
    p.add_argument("--engine-model", default="edge", help="model sent to --engine-url")
    p.add_argument("--repeats", type=int, default=3, help="profile: requests per prompt length")
    p.add_argument(
        "--calibrate-path",
        action="store_true",
        help="measure what the path (router, proxies) adds to TTFT over the engine alone, "
        "one request at a time, and give it to the simulator as the router's overhead",
    )
    p.add_argument(
        "--decode-from-bench",
        action="store_true",
        help="take the decode step from the bench's TPOT (on one machine the router, proxies "
        "and client share the cores with the engines while the bench runs)",
    )
    args = p.parse_args()

    words = int(args.bucket.split(":")[0])
    lengths = sorted({1, words, 2 * words, 64, 128})  # cover the bench's prompts
    before = await _profile(args.engine_url, lengths, args.repeats)
    users = load_settings(SimConfig, args.sim_config).regions[0].name if args.sim_config else None
    path_ms = await _path_overhead_ms(args, users) if args.calibrate_path else None

    plan = RunPlan(
        url=args.bench_url,
        workload=Workload(args.model, [parse_bucket(args.bucket)]),
        steps=[LoadStep("rate", args.rate)],
        variants=[Variant("bench")],
        duration=args.duration,
        max_requests=100_000,
        warmup=1,
    )
    records = [r for r in (await run_plan(plan))[0].records if r.ok]
    ttft = [r.ttft * 1000 for r in records if r.ttft is not None]
    tpot = [r.tpot * 1000 for r in records if r.tpot is not None]
    e2e = [r.e2e * 1000 for r in records if r.e2e is not None]
    prompt = statistics.mean(r.prompt_tokens for r in records if r.prompt_tokens) if records else 0
    # A shared machine drifts: profile again and take the mean of both.
    after = await _profile(args.engine_url, lengths, args.repeats)
    profile = _mean_profile(before, after)
    if args.decode_from_bench and tpot:
        profile = profile.model_copy(update={"decode_base_ms": statistics.median(tpot)})
    print(
        f"profile (mean of before/after): decode step {profile.decode_base_ms:.1f} ms, "
        f"prefill points {[(x, round(y * 1000)) for x, y in profile.prefill_points]}"
    )
    output = statistics.mean(r.output_tokens for r in records) if records else 0
    print(
        f"bench: {len(records)} ok requests at {args.rate}/s; prompt {prompt:.0f} tokens, "
        f"output {output:.1f} tokens"
    )

    if args.sim_config:
        config = load_settings(SimConfig, args.sim_config).model_dump()
        config["regions"][0]["rate"] = args.rate
        for region in config["regions"][1:]:
            region["rate"] = 0.0
    else:
        config = _edge_only(args.rtt_ms, args.rate)
    config["edge_profile"] = profile.model_dump()
    config["center"]["profile"] = profile.model_dump()
    config["workload"]["prompt_tokens"] = {"kind": "fixed", "value": max(1, round(prompt))}
    config["workload"]["output_tokens"] = {"kind": "fixed", "value": max(1, round(output))}
    if path_ms is not None:
        config.setdefault("policy", {})["router_overhead_ms"] = max(0.0, path_ms)
    config["duration_s"] = max(args.duration, 400 / max(args.rate, 1e-3))  # enough samples
    config["warmup_s"] = 5.0
    sim = summarize_result(Simulation(SimConfig.model_validate(config)).run())
    print(f"{'ms':<10}{'bench':>10}{'simulated':>12}{'diff':>9}")
    for name, values in (("TTFT", ttft), ("TPOT", tpot), ("E2E", e2e)):
        predicted = sim["same_city"][f"{name.lower()}_ms"]
        for q in (50, 95, 99):
            measured_q = percentile(values, q) or float("nan")
            sim_q = predicted[f"p{q}"] or float("nan")
            diff = (sim_q - measured_q) / measured_q * 100
            print(f"{name + ' p' + str(q):<10}{measured_q:>10.1f}{sim_q:>12.1f}{diff:>8.1f}%")


if __name__ == "__main__":
    asyncio.run(main())
