"""Same-city TTFT, hybrid routing versus all-to-center, and why the ratio is what it is.

One command, one lock hold (issue 8's acceptance run):

    .venv/bin/python -m studies.hybrid_vs_center --up \\
        --out bench/results/hybrid-vs-center.json

1. Engine floor: requests straight to edge-a's engine (no router, no proxy),
   one at a time after an idle pause (exponential, mean ``1 / min(rates)``:
   the state the bench's arrivals find the engine in), each with a fresh
   prompt of the bucket's size; then the same prompt again at once (a full
   prefix-cache hit). The first is what a same-city request can at best get
   on this machine; the difference between the two is its uncached prefill.
2. The bench (``hybrid-llm bench`` with the same method): both variants
   replay the same Poisson arrivals at each rate, one after the other, after
   warming their own paths (and every engine slot of each ``--warm-edge``,
   as many requests at once as it has slots: a batching edge keeps a prefix
   cache per slot, and before the engine copied prefixes between slots a
   slot's first prompt prefilled the chat template in full, 45 tokens
   instead of 14, 380-430 ms instead of ~140; a server that has run for a
   minute has used all its slots, so warming keeps runs comparable; the center's replicas,
   four slots each like the edges, are warmed by the center variant's own warm-up);
   ``hybrid`` sends ``model=auto`` (the router decides), ``center`` sends
   ``model=center`` (all to the center, 150 ms away). JSON and PNG are written to ``--out``.
3. The summary: per rate, same-city TTFT P50/P95/P99 of both, the P99
   ratio, the hybrid P99 that 5x would need, and the prompt tokens served
   from / outside the prefix cache. Load averages before and after.

``--up`` starts the local topology with emulated RTTs (``hybrid-llm up
--netem --detach``) and stops it afterwards; without it the topology must
already be up.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx

from hybrid_llm.bench import (
    LoadStep,
    RunPlan,
    Variant,
    Workload,
    build_report,
    parse_bucket,
    percentile,
    run_plan,
    send_streaming,
)
from hybrid_llm.bench.plot import write_plot
from hybrid_llm.local.topology import service_headers


def _load() -> str:
    return " ".join(f"{v:.2f}" for v in os.getloadavg())


async def engine_floor(url: str, bucket: str, n: int, gap_s: float) -> dict[str, float | None]:
    """TTFT straight to an engine: fresh prompts after idle pauses, then each repeated."""
    workload = Workload("edge", [parse_bucket(bucket)])
    rng = random.Random(1)
    fresh: list[float] = []
    repeat: list[float] = []
    uncached: list[int] = []
    async with httpx.AsyncClient(base_url=url, headers=service_headers(), timeout=120) as client:
        _, body = workload.draw()  # connection and first-call costs
        await send_streaming(client, workload.path, body, bucket=bucket, run_start=0.0)
        for _ in range(n):
            await asyncio.sleep(rng.expovariate(1.0 / gap_s))
            _, body = workload.draw()
            first = await send_streaming(client, workload.path, body, bucket=bucket, run_start=0.0)
            again = await send_streaming(client, workload.path, body, bucket=bucket, run_start=0.0)
            if first.ttft is not None and again.ttft is not None:
                fresh.append(first.ttft * 1000)
                repeat.append(again.ttft * 1000)
                uncached.append(first.prompt_tokens - first.cached_tokens)
    return {
        "fresh_p50_ms": percentile(fresh, 50),
        "fresh_min_ms": min(fresh, default=None),
        "repeat_p50_ms": percentile(repeat, 50),
        "uncached_tokens_p50": statistics.median(uncached) if uncached else None,
    }


async def warm_slots(url: str, bucket: str) -> int:
    """One request per slot of the edge at ``url``, all at once; returns the slot count."""
    workload = Workload("edge", [parse_bucket(bucket)])
    async with httpx.AsyncClient(base_url=url, headers=service_headers(), timeout=120) as client:
        slots = int((await client.get("/load")).json().get("capacity") or 1)
        bodies = [workload.draw()[1] for _ in range(slots)]
        path = workload.path
        await asyncio.gather(
            *(send_streaming(client, path, b, bucket=bucket, run_start=0.0) for b in bodies)
        )
    return slots


def _same_city(step: dict[str, Any]) -> list[dict[str, Any]]:
    return [r for r in step["requests"] if r["ok"] and r["ttft"] is not None]


def summarize_run(report: dict[str, Any]) -> list[str]:
    by: dict[tuple[float, str], dict[str, Any]] = {
        (s["load"], s["variant"]): s for s in report["steps"]
    }
    lines = [
        f"{'rate/s':>6} {'hybrid P50/P95/P99':>22} {'center P50/P95/P99':>22} "
        f"{'P99 ratio':>9} {'5x needs':>9} {'hybrid routes':>22} {'uncached tok':>12}"
    ]
    for rate in sorted({load for load, _ in by}):
        hyb, cen = by.get((rate, "hybrid")), by.get((rate, "center"))
        if hyb is None or cen is None:
            continue
        h = hyb["summary"]["ttft_ms"]
        c = cen["summary"]["ttft_ms"]
        routes: dict[str, int] = {}
        for r in _same_city(hyb):
            routes[r["region"] or "?"] = routes.get(r["region"] or "?", 0) + 1
        uncached = [r["prompt_tokens"] - r["cached_tokens"] for r in _same_city(hyb)]
        lines.append(
            f"{rate:>6g} {h['p50']:>8.1f}/{h['p95']:.1f}/{h['p99']:.1f} "
            f"{c['p50']:>8.1f}/{c['p95']:.1f}/{c['p99']:.1f} "
            f"{c['p99'] / h['p99']:>8.2f}x {c['p99'] / 5:>8.1f} "
            f"{', '.join(f'{k}:{v}' for k, v in sorted(routes.items())):>22} "
            f"{statistics.median(uncached) if uncached else 0:>12g}"
        )
    return lines


async def measure(args: argparse.Namespace, rates: list[float]) -> dict[str, Any]:
    print(f"load average before: {_load()}")
    if args.probe:
        floor = await engine_floor(args.edge_url, args.bucket, args.probe, 1 / min(rates))
        print("edge-a engine alone: " + json.dumps(floor))
    for url in args.warm_edge:
        print(f"warmed {await warm_slots(url, args.bucket)} slots of {url}")
    plan = RunPlan(
        url=args.url,
        workload=Workload("auto", [parse_bucket(args.bucket)], seed=args.seed),
        steps=[LoadStep("rate", r) for r in rates],
        variants=[Variant("hybrid", model="auto"), Variant("center", model="center")],
        duration=args.duration,
        max_requests=100_000,
        warmup=args.warmup,
        warmup_concurrency=args.warmup_concurrency,
        seed=args.seed,
    )
    started = time.perf_counter()
    report = build_report(plan, await run_plan(plan), "ttft_ms.p99")
    print(f"bench: {time.perf_counter() - started:.0f} s, load average after: {_load()}")
    return report


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--url", default="http://127.0.0.1:8080", help="the router")
    p.add_argument("--edge-url", default="http://127.0.0.1:8101", help="edge-a, straight")
    p.add_argument(
        "--warm-edge",
        action="append",
        default=None,
        help="edge whose every slot is warmed first (default: edge-a and edge-b, straight)",
    )
    p.add_argument("--rate", default="0.5,1")
    p.add_argument("--duration", type=float, default=60.0, help="seconds per step")
    p.add_argument("--bucket", default="8:16", help="PROMPT:OUTPUT words (a short chat turn)")
    p.add_argument("--warmup", type=int, default=12)
    p.add_argument("--warmup-concurrency", type=int, default=4)
    p.add_argument("--probe", type=int, default=8, help="engine-floor requests (0: skip)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", type=Path, default=Path("bench/results/hybrid-vs-center.json"))
    p.add_argument("--up", action="store_true", help="start and stop the local topology")
    args = p.parse_args()
    rates = [float(r) for r in args.rate.split(",")]
    if args.warm_edge is None:
        args.warm_edge = ["http://127.0.0.1:8101", "http://127.0.0.1:8102"]
    cli = [sys.executable, "-m", "hybrid_llm"]
    if args.up:
        subprocess.run([*cli, "up", "--netem", "--detach"], check=True, stdout=subprocess.DEVNULL)
    try:
        report = asyncio.run(measure(args, rates))
    finally:
        if args.up:
            subprocess.run([*cli, "down"], check=False, stdout=subprocess.DEVNULL)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=1), encoding="utf-8")
    write_plot(report, args.out.with_suffix(".png"))
    print("\n".join(summarize_run(report)))
    print(f"report: {args.out}  plot: {args.out.with_suffix('.png')}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
