"""The measuring half of the simulator check: the engine's profile, what the
path adds, the engines' state and a bench run, all in one go.

See :mod:`hybrid_llm.fleet.simcheck` for the method; everything here talks to real
servers, and :func:`measure` returns what :mod:`hybrid_llm.fleet.simcheck.replay`
simulates again (JSON-ready, so ``--save`` / ``--replay`` work on it).
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
    builtin_workload,
    dataset_workload,
    parse_bucket,
    run_plan,
)
from hybrid_llm.bench.client import send_streaming
from hybrid_llm.bench.profile import measure_profile
from hybrid_llm.bench.workload import Source
from hybrid_llm.fleet.sim import EngineProfile, SimConfig
from hybrid_llm.fleet.sim.spread import merge_spreads
from hybrid_llm.local.topology import service_headers, service_token
from servekit.config import load_settings

__all__ = [
    "bench_source",
    "conversational",
    "load_average",
    "mean_profile",
    "measure",
    "pool_points",
]


def conversational(args: argparse.Namespace) -> bool:
    """Whether the bench sends a conversation workload or dataset (not ``--bucket``)."""
    return bool(getattr(args, "workload", None) or getattr(args, "dataset", None))


def bench_source(args: argparse.Namespace) -> Source:
    """What the bench sends: ``--dataset``, ``--workload`` or the ``--bucket`` prompts."""
    max_tokens = getattr(args, "max_tokens", None) or 16
    if getattr(args, "dataset", None):
        return dataset_workload(Path(args.dataset), args.model, max_tokens=max_tokens)
    if getattr(args, "workload", None):
        return builtin_workload(args.workload, args.model, max_tokens=max_tokens)
    return Workload(args.model, [parse_bucket(args.bucket)])


def _profile_lengths(args: argparse.Namespace, words: int) -> list[int]:
    """Prompt words the profile measures: ``--profile-lengths``, else bracketing the
    bucket's prompt (a conversation workload's prompts reach further: give them)."""
    if getattr(args, "profile_lengths", None):
        return sorted(set(args.profile_lengths))
    return sorted({1, words, 2 * words, 64})


def load_average() -> str:
    return " ".join(f"{v:.2f}" for v in os.getloadavg())


async def _path_overhead_ms(
    args: argparse.Namespace, region: str | None, gap_s: float, n: int
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
        httpx.AsyncClient(
            base_url=args.engine_url, headers=service_headers(), timeout=120
        ) as engine,
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


async def _profile(
    url: str, lengths: list[int], repeats: int, gap_s: float, probe_words: int
) -> tuple[EngineProfile, int]:
    """The engine's profile, and the prompt tokens its prompts found cached."""
    t0 = time.perf_counter()
    measured = await measure_profile(
        url,
        prompt_lengths=lengths,
        repeats=repeats,
        gap_s=gap_s,
        mixed_prompt=probe_words,
        api_key=service_token(),
    )
    profile: EngineProfile = measured["profile"]
    points = ", ".join(f"{x:.0f}:{y * 1000:.0f}" for x, y in profile.prefill_points)
    mixed = ", ".join(f"{k}:{s * 1000:.1f}" for k, s in profile.mixed_points)
    spread = ", ".join(f"p{q * 100:g} {r:.2f}" for q, r in profile.prefill_spread if q >= 0.5)
    print(
        f"profile ({time.perf_counter() - t0:.0f}s): TTFT by prompt tokens (ms) {points}; "
        f"decode step {profile.decode_base_ms:.1f} ms, slots {profile.slots}; "
        f"prefill step + ms by decoders riding along {mixed or '-'}; "
        f"prefill / median {spread or '-'}; {measured['preamble_tokens']} tokens cached"
    )
    return profile, int(measured["preamble_tokens"])


def _mean_points(a: list[tuple[int, float]], b: list[tuple[int, float]]) -> list[tuple[int, float]]:
    by_x: dict[int, list[float]] = {}
    for x, y in [*a, *b]:
        by_x.setdefault(x, []).append(y)
    return sorted((x, statistics.mean(ys)) for x, ys in by_x.items())


def pool_points(points: list[tuple[int, float]], within: int = 3) -> list[tuple[int, float]]:
    """Measured (tokens, seconds) points a few tokens apart pooled into one (their
    means). One prompt length in words comes out a token longer or shorter from one
    request to the next, and the simulator prices cached tokens by differences of
    the curve: 99:492 ms beside 100:451 ms is noise, not a -41 ms token."""
    groups: list[list[tuple[int, float]]] = []
    for x, y in sorted(points):
        if groups and x - groups[-1][0][0] <= within:
            groups[-1].append((x, y))
        else:
            groups.append([(x, y)])
    return [
        (round(statistics.mean(x for x, _ in g)), statistics.mean(y for _, y in g)) for g in groups
    ]


def mean_profile(a: EngineProfile, b: EngineProfile) -> EngineProfile:
    """The mean of two profiles of one engine (before and after the bench)."""
    steps = {
        n: merge_spreads(a.step_spread.get(n, []), b.step_spread.get(n, []))
        for n in {*a.step_spread, *b.step_spread}
    }
    return a.model_copy(
        update={
            "decode_base_ms": (a.decode_base_ms + b.decode_base_ms) / 2,
            "decode_per_seq_ms": (a.decode_per_seq_ms + b.decode_per_seq_ms) / 2,
            "prefill_points": _mean_points(a.prefill_points, b.prefill_points),
            "mixed_points": _mean_points(a.mixed_points, b.mixed_points),
            "prefill_spread": merge_spreads(a.prefill_spread, b.prefill_spread),
            "step_spread": dict(sorted(steps.items())),
        }
    )


async def _warm_states(pairs: list[str]) -> dict[str, dict[str, Any]]:
    """Each named instance's /load now: what its engine reports before the bench."""
    out: dict[str, dict[str, Any]] = {}
    async with httpx.AsyncClient(headers=service_headers(), timeout=10) as client:
        for pair in pairs:
            name, _, url = pair.partition("=")
            load = (await client.get(url.rstrip("/") + "/load")).json()
            out[name] = {
                "ttft_p50_ms": load.get("ttft_p50_ms"),
                "ttft_p95_ms": load.get("ttft_p95_ms"),
                "samples": min(512, int(load.get("requests_ok") or 0)),
                "decode_tokens_per_s": load.get("decode_tokens_per_s"),
                "prefill_tokens_per_s": load.get("prefill_tokens_per_s"),
                "busy_ms_per_seq": load.get("busy_ms_per_seq"),
            }
            print(f"{name} before the bench ({url}): {out[name]}")
    return out


async def measure(args: argparse.Namespace) -> dict[str, Any]:
    """Profile, path calibration and bench in one go; everything the simulation needs."""
    if not args.engine_url or not args.bench_url:
        raise SystemExit("--engine-url and --bench-url are needed to measure")
    words = int(args.bucket.split(":")[0])
    lengths = _profile_lengths(args, words)
    gap = args.profile_gap if args.profile_gap is not None else 1.0 / args.rate
    load_start = load_average()
    print(f"load average at start: {load_start}; profile and path requests {gap:g} s apart (mean)")
    before, preamble = await _profile(args.engine_url, lengths, args.repeats, gap, words)
    users = load_settings(SimConfig, args.sim_config).regions[0].name if args.sim_config else None
    path_ms = None
    if args.calibrate_path:
        path_ms = await _path_overhead_ms(args, users, gap, args.path_pairs)

    warm = await _warm_states(args.edge_load)
    plan = RunPlan(
        url=args.bench_url,
        workload=bench_source(args),
        steps=[LoadStep("rate", args.rate)],
        variants=[Variant("bench")],
        duration=args.duration,
        max_requests=100_000,
        warmup=1,
        api_key=service_token() if args.edge_only else None,  # an edge wants its token
    )
    records = [r for r in (await run_plan(plan))[0].records if r.ok]
    # A shared machine drifts: profile again and take the mean of both.
    after, preamble_after = await _profile(args.engine_url, lengths, args.repeats, gap, words)
    profile = mean_profile(before, after)
    tpot = [r.tpot for r in records if r.tpot is not None]
    if args.decode_from_bench and tpot:
        profile = profile.model_copy(update={"decode_base_ms": statistics.median(tpot) * 1000})
    return {
        "args": {
            k: str(v) if isinstance(v, Path) else v
            for k, v in vars(args).items()
            if not callable(v)  # the CLI's handler
        },
        "load_start": load_start,
        "load_end": load_average(),
        "profile": profile.model_dump(),
        "profiles": [before.model_dump(), after.model_dump()],
        "path_ms": path_ms,
        "preamble_tokens": min(preamble, preamble_after),
        "warm": warm,
        "records": [r.to_dict() for r in records],
    }
