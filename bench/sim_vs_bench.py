"""Does the simulator predict what the bench measures? One run, both numbers.

    # a single edge behind a delay proxy (hybrid-llm netem), no router:
    python bench/sim_vs_bench.py --engine-url http://127.0.0.1:8101 \
        --bench-url http://127.0.0.1:9101 --rtt-ms 2 --edge-only --rate 1 --duration 60
    # the local topology through the router (hybrid-llm up --netem):
    python bench/sim_vs_bench.py --engine-url http://127.0.0.1:8101 \
        --bench-url http://127.0.0.1:8080 --sim-config configs/local-sim.yaml \
        --rate 0.5 --duration 90 --bucket 8:16

All in one run (hold the bench lock around it), so machine drift hits every part:

1. measures the engine profile at ``--engine-url`` (``hybrid-llm profile``), each
   request after an idle pause drawn like the bench's arrival gaps (mean
   ``1 / --rate``): on a shared machine an engine idle for a second or two
   prefills up to twice as slowly as one measured back to back, and the bench's
   requests find it idle;
2. measures what the path adds (``--calibrate-path``, on by default): the same
   requests alternately straight to the engine and through ``--bench-url``
   (same-city routes only), with the same pauses; the median difference minus
   the same-city RTT becomes the simulator's router overhead (measured, never
   a tuning knob; clamped at 0);
3. drives Poisson load at ``--bench-url`` (``hybrid-llm bench --rate``), then
   profiles again; the simulation uses the mean of both profiles;
4. simulates the same fleet, profile, rate and measured prompt/output lengths
   and prints TTFT, TPOT and E2E percentiles from both and the difference.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import statistics
import time
from pathlib import Path
from typing import Any

import httpx

from hybrid_llm.bench import (
    LoadStep,
    RunPlan,
    Variant,
    Workload,
    parse_bucket,
    run_plan,
)
from hybrid_llm.bench.client import send_streaming
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


async def _path_overhead_ms(
    args: argparse.Namespace, region: str | None, gap_s: float, n: int = 12
) -> float:
    """What the path (router, delay proxies) adds to TTFT beyond the engine and the
    same-city RTT the simulator adds itself: median routed (same-city) TTFT minus
    median direct TTFT, one request at a time, direct and routed alternating (so
    drift hits both alike), each after an idle pause like the bench's arrivals."""
    bucket = parse_bucket(args.bucket)
    rng = random.Random(7)
    direct: list[float] = []
    routed: list[float] = []
    async with (
        httpx.AsyncClient(base_url=args.engine_url, timeout=120) as engine,
        httpx.AsyncClient(base_url=args.bench_url, timeout=120) as front,
    ):
        workloads = (Workload(args.engine_model, [bucket]), Workload(args.model, [bucket]))
        for client, workload in ((engine, workloads[0]), (front, workloads[1])):  # warm-up
            await send_streaming(
                client, workload.path, workload.body(bucket), bucket="warm", run_start=0.0
            )
        for _ in range(n):
            for client, workload, out in (
                (engine, workloads[0], direct),
                (front, workloads[1], routed),
            ):
                await asyncio.sleep(rng.expovariate(1.0 / gap_s) if gap_s > 0 else 0.0)
                rec = await send_streaming(
                    client, workload.path, workload.body(bucket), bucket="path", run_start=0.0
                )
                if (
                    rec.ok
                    and rec.ttft is not None
                    and (out is direct or region in (None, rec.region))
                ):
                    out.append(rec.ttft)
    if not direct or not routed:
        raise SystemExit("path calibration: no successful requests")
    overhead = (statistics.median(routed) - statistics.median(direct)) * 1000 - args.rtt_ms
    print(
        f"path: direct TTFT p50 {statistics.median(direct) * 1000:.1f} ms (n={len(direct)}), "
        f"through {args.bench_url} (same city) {statistics.median(routed) * 1000:.1f} ms "
        f"(n={len(routed)}): {overhead:.1f} ms added beyond the {args.rtt_ms:g} ms RTT"
    )
    return overhead


async def _profile(url: str, lengths: list[int], repeats: int, gap_s: float) -> EngineProfile:
    t0 = time.perf_counter()
    measured = await measure_profile(url, prompt_lengths=lengths, repeats=repeats, gap_s=gap_s)
    profile: EngineProfile = measured["profile"]
    points = ", ".join(f"{x:.0f}:{y * 1000:.0f}" for x, y in profile.prefill_points)
    print(
        f"profile ({time.perf_counter() - t0:.0f}s): TTFT by prompt tokens (ms) {points}; "
        f"decode step {profile.decode_base_ms:.1f} ms, slots {profile.slots}"
    )
    return profile


def _load() -> str:
    return " ".join(f"{v:.2f}" for v in os.getloadavg())


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
        action=argparse.BooleanOptionalAction,
        default=True,
        help="measure what the path (router, proxies) adds to TTFT over the engine alone "
        "and give it to the simulator as the router's overhead (default: on)",
    )
    p.add_argument(
        "--profile-gap",
        type=float,
        help="mean idle seconds before each profile/path request (default 1 / --rate: the "
        "engine measured in the state the bench's arrivals find it)",
    )
    p.add_argument(
        "--decode-from-bench",
        action="store_true",
        help="take the decode step from the bench's TPOT (on one machine the router, proxies "
        "and client share the cores with the engines while the bench runs)",
    )
    args = p.parse_args()

    words = int(args.bucket.split(":")[0])
    lengths = sorted({1, words, 2 * words, 64})  # bracket the bench's prompts
    gap = args.profile_gap if args.profile_gap is not None else 1.0 / args.rate
    print(f"load average at start: {_load()}; profile and path requests {gap:g} s apart (mean)")
    before = await _profile(args.engine_url, lengths, args.repeats, gap)
    users = load_settings(SimConfig, args.sim_config).regions[0].name if args.sim_config else None
    path_ms = await _path_overhead_ms(args, users, gap) if args.calibrate_path else None

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
    after = await _profile(args.engine_url, lengths, args.repeats, gap)
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
    print(f"load average at end: {_load()}")


if __name__ == "__main__":
    asyncio.run(main())
