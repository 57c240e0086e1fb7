"""``hybrid-llm simulate``: compare routing policies on a fleet, or size it."""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from hybrid_llm.fleet.sim.config import PolicyName, SimConfig
from hybrid_llm.fleet.sim.report import size_edges, summarize_result
from hybrid_llm.fleet.sim.simulation import Simulation

__all__ = ["register"]

POLICIES: tuple[PolicyName, ...] = ("all-center", "hybrid", "hybrid-hedge")


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "simulate",
        help="discrete-event fleet simulator: compare routing policies, size edges",
        description=(
            "Simulate a fleet (regions, RTT table, edge and center engine profiles, "
            "workload) under routing policies; or find the edges per region that keep "
            "same-city P99 TTFT under an SLO."
        ),
    )
    p.add_argument("--config", type=Path, required=True, help="simulation YAML")
    p.add_argument("--policy", choices=POLICIES, action="append", help="default: all three")
    p.add_argument("--duration", type=float, help="override duration_s")
    p.add_argument("--seed", type=int)
    p.add_argument("--size", action="store_true", help="sizing mode (edges per region)")
    p.add_argument("--total-rps", type=float, help="sizing: offered requests/s over all regions")
    p.add_argument("--slo-ms", type=float, default=200.0, help="sizing: same-city P99 TTFT SLO")
    p.add_argument("--max-edges", type=int, default=100, help="sizing: upper bound per region")
    p.add_argument("--json", type=Path, help="write the full report here")
    p.set_defaults(func=run)


def _load(args: argparse.Namespace) -> SimConfig:
    from servekit.config import load_settings

    return load_settings(SimConfig, args.config, duration_s=args.duration, seed=args.seed)


def run(args: argparse.Namespace) -> int:
    from servekit.config import ConfigError

    console = Console(width=max(Console().width, 160))
    try:
        config = _load(args)
    except ConfigError as exc:
        console.print(f"[red]{exc}")
        return 2
    out: dict[str, Any]
    if args.size:
        policy = (args.policy or ["hybrid"])[0]
        config = config.model_copy(
            update={"policy": config.policy.model_copy(update={"name": policy})}
        )
        total = args.total_rps or sum(r.rate for r in config.regions)
        out = size_edges(
            config,
            total,
            slo_ms=args.slo_ms,
            max_edges=args.max_edges,
            log=lambda m: console.print(f"[dim]{m}"),
        )
        _print_sizing(out, console, len(config.regions))
    else:
        out = {"runs": []}
        for name in args.policy or POLICIES:
            cfg = config.model_copy(
                update={"policy": config.policy.model_copy(update={"name": name})}
            )
            t0 = time.perf_counter()
            summary = summarize_result(Simulation(cfg).run())
            summary["runtime_s"] = time.perf_counter() - t0
            out["runs"].append(summary)
        _print_runs(out["runs"], console)
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(out, indent=1, default=str), encoding="utf-8")
        console.print(f"report: {args.json}")
    return 0


def _f(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f}"


def _util(tiers: dict[str, Any], tier: str) -> str:
    x = tiers.get(tier)
    return "-" if not x else f"{x['busy']:.0%}/{x['occupancy']:.0%}"


def _print_runs(runs: list[dict[str, Any]], console: Console) -> None:
    table = Table(title="hybrid-llm simulate")
    cols = ["policy", "offered req/s", "same-city TTFT p50/p95/p99 ms", "TPOT p50/p99 ms"]
    cols += ["edge busy/occ", "center busy/occ", "GPUs edge+center", "fallback/hedge/fail"]
    cols += ["wall s"]
    for col in cols:
        table.add_column(col, justify="right")
    for s in runs:
        t, tp = s["same_city"]["ttft_ms"], s["all"]["tpot_ms"]
        tiers = s["tiers"]

        gpus = "+".join(str(int(tiers.get(k, {}).get("gpus", 0))) for k in ("edge", "center"))
        table.add_row(
            s["policy"],
            f"{s['offered_rps']:g}",
            f"{_f(t['p50'])}/{_f(t['p95'])}/{_f(t['p99'])}",
            f"{_f(tp['p50'])}/{_f(tp['p99'])}",
            _util(tiers, "edge"),
            _util(tiers, "center"),
            gpus,
            f"{s['fallbacks']}/{s['hedged']}/{s['failed']}",
            f"{s['runtime_s']:.1f}",
        )
    console.print(table)


def _print_sizing(out: dict[str, Any], console: Console, regions: int) -> None:
    if not out["feasible"]:
        p99 = out["at_max"]["same_city"]["ttft_ms"]["p99"]
        console.print(
            f"[red]not feasible: even {out['at_max']['edges_per_region']} edges per region "
            f"give same-city P99 TTFT {_f(p99)} ms (prefill or RTT alone may exceed the SLO)"
        )
        return
    res = out["result"]
    t = res["same_city"]["ttft_ms"]
    edges = out["edges_per_region"]
    console.print(
        f"[green]{edges} edges per region[/] ({edges * regions} in total) keep same-city "
        f"P99 TTFT under {out['slo_ms']:.0f} ms at {out['total_rps']:.0f} req/s: "
        f"p50/p95/p99 {_f(t['p50'])}/{_f(t['p95'])}/{_f(t['p99'])} ms; "
        f"edge occupancy {res['tiers']['edge']['occupancy']:.0%}; "
        f"{out['probes']} simulations in {out['runtime_s']:.1f}s"
    )
