"""Does the simulator predict what the bench measures? One run, both numbers.

    # a single edge behind a delay proxy (hybrid-llm netem), no router:
    python bench/sim_vs_bench.py --engine-url http://127.0.0.1:8101 \
        --bench-url http://127.0.0.1:9101 --rtt-ms 2 --edge-only --rate 2 --duration 60 \
        --model edge --edge-load edge/a/0=http://127.0.0.1:8101
    # the local topology through the router (hybrid-llm up --netem):
    python bench/sim_vs_bench.py --engine-url http://127.0.0.1:8101 \
        --bench-url http://127.0.0.1:8080 --sim-config configs/local-sim.yaml \
        --rate 0.5 --duration 90 --bucket 8:16 \
        --edge-load edge/region-a/0=http://127.0.0.1:8101 \
        --edge-load edge/region-b/0=http://127.0.0.1:8102 --save var/svb-0.5.json
    # the same measurement simulated again (after a change to the simulator):
    python bench/sim_vs_bench.py --replay var/svb-0.5.json

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
3. reads each ``--edge-load`` instance's ``/load`` right before the bench: the
   simulated instance starts from the TTFT P50/P95 and rates its real engine
   reported (the router's busy penalty is computed from them, and the profile's
   long prompts are in that TTFT window);
4. drives Poisson load at ``--bench-url`` (``hybrid-llm bench --rate``; its
   schedule is seeded, the same arrival times every run), then profiles again;
   the simulation uses the mean of both profiles;
5. simulates the same fleet, profile, measured prompt/output lengths, shared
   prompt prefix (the least any request found cached) and the router's own
   token estimate of the bench's text, twice: on the bench's own arrival times
   (replayed with different seeds to 400 requests) and as a long Poisson run;
   prints P50/P95/P99 of TTFT, TPOT and E2E from the bench and both
   simulations with the differences, and the share of requests per route.

``--save`` writes the measurement (profile, path, edge state, every bench
record) as JSON; ``--replay`` simulates a saved one again without measuring,
so a change to the simulator is compared on the same bench data.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import random
import statistics
import time
from collections import Counter
from pathlib import Path
from typing import Any

import httpx

from geo_router.planner import estimate_prompt_tokens
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
from hybrid_llm.sim import EngineProfile, SimConfig, SimResult, Simulation
from hybrid_llm.sim.request import SimRequest
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
    overhead = (statistics.median(routed) - statistics.median(direct)) * 1000 - float(args.rtt_ms)
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


def _route(tier: str, region: str) -> str:
    """Where a request was served: ``center`` or ``edge@<region>``."""
    if tier == "-":  # no router headers: straight to the engine (--edge-only)
        return "direct"
    return "center" if tier == "center" else f"{tier}@{region}"


def _arg_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser()
    p.add_argument("--engine-url", help="an edge agent, for the profile")
    p.add_argument("--bench-url", help="what users hit (proxy or router)")
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
    p.add_argument(
        "--edge-load",
        action="append",
        default=[],
        metavar="INSTANCE=URL",
        help="a simulated instance (edge/<region>/<i>) and the real one's URL: its /load "
        "just before the bench (TTFT P50/P95, rates) is the simulated one's starting state",
    )
    p.add_argument(
        "--chunk-tokens",
        type=int,
        default=128,
        help="the edge engine's prefill chunk (engine.chunk_tokens of configs/edge-local.yaml)",
    )
    p.add_argument("--save", type=Path, help="write what was measured here (JSON)")
    p.add_argument(
        "--replay",
        type=Path,
        help="simulate a saved measurement again (--save of an earlier run) instead of "
        "measuring: the simulator's model changes, the bench data stays the same",
    )
    return p


async def _warm_states(pairs: list[str]) -> dict[str, dict[str, Any]]:
    """Each named instance's /load now: what its engine reports before the bench."""
    out: dict[str, dict[str, Any]] = {}
    async with httpx.AsyncClient(timeout=10) as client:
        for pair in pairs:
            name, _, url = pair.partition("=")
            load = (await client.get(url.rstrip("/") + "/load")).json()
            out[name] = {
                "ttft_p50_ms": load.get("ttft_p50_ms"),
                "ttft_p95_ms": load.get("ttft_p95_ms"),
                "samples": min(512, int(load.get("requests_ok") or 0)),
                "decode_tokens_per_s": load.get("decode_tokens_per_s"),
                "prefill_tokens_per_s": load.get("prefill_tokens_per_s"),
            }
            print(f"{name} before the bench ({url}): {out[name]}")
    return out


async def measure(args: argparse.Namespace) -> dict[str, Any]:
    """Profile, path calibration and bench in one go; everything the simulation needs."""
    if not args.engine_url or not args.bench_url:
        raise SystemExit("--engine-url and --bench-url are needed to measure")
    words = int(args.bucket.split(":")[0])
    lengths = sorted({1, words, 2 * words, 64})  # bracket the bench's prompts
    gap = args.profile_gap if args.profile_gap is not None else 1.0 / args.rate
    load_start = _load()
    print(f"load average at start: {load_start}; profile and path requests {gap:g} s apart (mean)")
    before = await _profile(args.engine_url, lengths, args.repeats, gap)
    users = load_settings(SimConfig, args.sim_config).regions[0].name if args.sim_config else None
    path_ms = await _path_overhead_ms(args, users, gap) if args.calibrate_path else None

    warm = await _warm_states(args.edge_load)
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
    # A shared machine drifts: profile again and take the mean of both.
    after = await _profile(args.engine_url, lengths, args.repeats, gap)
    profile = _mean_profile(before, after)
    tpot = [r.tpot for r in records if r.tpot is not None]
    if args.decode_from_bench and tpot:
        profile = profile.model_copy(update={"decode_base_ms": statistics.median(tpot) * 1000})
    return {
        "args": {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()},
        "load_start": load_start,
        "load_end": _load(),
        "profile": profile.model_dump(),
        "profiles": [before.model_dump(), after.model_dump()],
        "path_ms": path_ms,
        "warm": warm,
        "records": [r.to_dict() for r in records],
    }


def _config(args: argparse.Namespace, measured: dict[str, Any]) -> dict[str, Any]:
    """The same fleet, profile, rate and lengths as the measurement."""
    records = measured["records"]
    profile = EngineProfile.model_validate(measured["profile"])
    prompt = statistics.mean(r["prompt_tokens"] for r in records if r["prompt_tokens"])
    output = statistics.mean(r["output_tokens"] for r in records)
    # The preamble every prompt shares: the least any request found cached (later
    # prompts of one run share a few more tokens with the one before them).
    cached = [r["cached_tokens"] for r in records if r["cached_tokens"]]
    prefix = min(cached) if cached else 0
    # What the router estimates from the client's text (its own code, on the bench's bodies).
    bucket = parse_bucket(args.bucket)
    workload = Workload(args.model, [bucket])
    estimate = statistics.mean(estimate_prompt_tokens(workload.body(bucket)) for _ in range(20))
    print(
        f"profile (mean of before/after): decode step {profile.decode_base_ms:.1f} ms "
        f"+ {profile.decode_per_seq_ms:.1f} ms/extra sequence, slots {profile.slots}, "
        f"prefill points {[(x, round(y * 1000)) for x, y in profile.prefill_points]}"
    )
    print(
        f"bench: {len(records)} ok requests at {args.rate}/s; prompt {prompt:.0f} tokens "
        f"({prefix} of them a cached prefix; the router estimates {estimate:.0f}), "
        f"output {output:.1f} tokens"
    )
    if args.sim_config:
        config = load_settings(SimConfig, args.sim_config).model_dump()
        config["regions"][0]["rate"] = args.rate
        for region in config["regions"][1:]:
            region["rate"] = 0.0
    else:
        config = _edge_only(args.rtt_ms, args.rate)
    config["edge_profile"] = profile.model_dump() | {"chunk_tokens": args.chunk_tokens}
    config["center"]["profile"] = profile.model_dump()
    config["workload"]["prompt_tokens"] = {"kind": "fixed", "value": max(1, round(prompt))}
    config["workload"]["output_tokens"] = {"kind": "fixed", "value": max(1, round(output))}
    config["workload"]["cached_prefix_tokens"] = prefix
    config["workload"]["template_tokens"] = max(0, round(prompt - estimate))
    config["warm"] = measured.get("warm") or {}
    if measured["path_ms"] is not None:
        config.setdefault("policy", {})["router_overhead_ms"] = max(0.0, measured["path_ms"])
    return config


def _window(result: SimResult) -> list[SimRequest]:
    return [
        r
        for r in result.requests
        if result.measured_from <= r.arrival < result.measured_to and r.e2e is not None
    ]


def simulate(args: argparse.Namespace, measured: dict[str, Any]) -> dict[str, list[SimRequest]]:
    """Two simulations of the measured fleet: the bench's own arrival times (its
    Poisson schedule is seeded, the same every run) replayed with different seeds
    until there are 400 requests, each replay starting from the engines' state
    before the bench; and one long Poisson run at the same rate."""
    config = _config(args, measured)
    starts = sorted(r["start"] for r in measured["records"])
    trace = dict(config, warmup_s=0.0, duration_s=(starts[-1] if starts else 0.0) + 1.0)
    trace["regions"] = [dict(r) for r in config["regions"]]
    trace["regions"][0]["arrivals"] = starts
    replays = max(1, math.ceil(400 / max(1, len(starts))))
    traced: list[SimRequest] = []
    for seed in range(replays):
        traced += _window(Simulation(SimConfig.model_validate(trace | {"seed": seed})).run())
    config["duration_s"] = max(args.duration, 400 / max(args.rate, 1e-3))  # enough samples
    config["warmup_s"] = 5.0
    poisson = _window(Simulation(SimConfig.model_validate(config)).run())
    print(
        f"simulated: the bench's arrivals x {replays} seeds, and Poisson {config['duration_s']:g}s"
    )
    return {"sim (bench arrivals)": traced, "sim (Poisson)": poisson}


def _pct(values: list[float], q: int) -> float:
    return percentile(values, q) or float("nan")


def compare(records: list[dict[str, Any]], sims: dict[str, list[SimRequest]]) -> None:
    """Percentiles of both side by side, and where the requests were served."""
    keys = (("TTFT", "ttft"), ("TPOT", "tpot"), ("E2E", "e2e"))
    bench = {n: [r[k] * 1000 for r in records if r[k] is not None] for n, k in keys}
    header = f"{'ms':<10}{'bench':>9}"
    for name in sims:
        header += f"{name:>24}{'diff':>8}"
    print(header)
    for name, key in keys:
        for q in (50, 95, 99):
            measured_q = _pct(bench[name], q)
            line = f"{name + ' p' + str(q):<10}{measured_q:>9.1f}"
            for reqs in sims.values():
                values = [getattr(r, key) * 1000 for r in reqs if getattr(r, key) is not None]
                sim_q = _pct(values, q)
                line += f"{sim_q:>24.1f}{(sim_q - measured_q) / measured_q * 100:>7.1f}%"
            print(line)
    routes_b = Counter(_route(r["tier"], r["region"]) for r in records)
    direct = all(r["tier"] == "-" for r in records)
    routes_s = {
        name: Counter(
            "direct" if direct else _route(r.winner.instance.tier, r.winner.instance.region)
            for r in reqs
            if r.winner is not None and r.winner.instance is not None
        )
        for name, reqs in sims.items()
    }
    print(f"{'route':<18}{'bench':>14}" + "".join(f"{name:>24}" for name in sims))
    for route in sorted(set(routes_b).union(*routes_s.values())):
        line = f"{route:<18}{routes_b[route]:>7} {routes_b[route] / len(records) * 100:>5.1f}%"
        for name, reqs in sims.items():
            n = routes_s[name][route]
            line += f"{n:>17} {n / max(1, len(reqs)) * 100:>5.1f}%"
        print(line)


async def main() -> None:
    args = _arg_parser().parse_args()
    if args.replay:
        measured = json.loads(args.replay.read_text(encoding="utf-8"))
        saved = measured["args"]
        keys = ("sim_config", "edge_only", "rtt_ms", "rate", "duration", "bucket", "chunk_tokens")
        for key in keys:
            value = saved.get(key)
            if key in saved:
                setattr(args, key, Path(value) if key == "sim_config" and value else value)
        print(f"replaying {args.replay} (measured at load {measured['load_start']})")
    else:
        measured = await measure(args)
        if args.save:
            args.save.parent.mkdir(parents=True, exist_ok=True)
            args.save.write_text(json.dumps(measured, indent=1), encoding="utf-8")
            print(f"measurement saved to {args.save}")
    compare(measured["records"], simulate(args, measured))
    print(f"load average at end: {_load()}")


if __name__ == "__main__":
    asyncio.run(main())
