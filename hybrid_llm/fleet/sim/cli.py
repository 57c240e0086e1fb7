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
from hybrid_llm.fleet.sim.report import fmt_ms, summarize_result, tidy
from hybrid_llm.fleet.sim.simulation import Simulation
from hybrid_llm.fleet.sim.sizing import Sizer, Slo, compare

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
    p.add_argument(
        "--size",
        action="store_true",
        help="sizing mode: the cheapest fleet (edges per region, center replicas) per policy",
    )
    p.add_argument("--total-rps", type=float, help="sizing: offered requests/s over all regions")
    p.add_argument("--slo-ms", type=float, default=200.0, help="sizing: same-city P99 TTFT SLO")
    p.add_argument("--slo-p95-ms", type=float, help="sizing: same-city P95 TTFT SLO (default none)")
    p.add_argument(
        "--hard-slo-ms",
        type=float,
        default=1000.0,
        help="sizing: TTFT P99 bound of hard requests (the center's)",
    )
    p.add_argument(
        "--max-hard-on-edges",
        type=float,
        default=0.05,
        help="sizing: share of hard requests an edge may answer (a starved center's fallback)",
    )
    p.add_argument("--max-edges", type=int, default=100, help="sizing: upper bound per region")
    p.add_argument("--max-replicas", type=int, default=64, help="sizing: upper bound, center")
    p.add_argument(
        "--gpu-price",
        action="append",
        default=[],
        metavar="KIND=USD",
        help="sizing: USD per GPU-hour of a GPU kind (overrides gpu_hour_usd; e.g. H100=6.88)",
    )
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
        sized = _size(args, config, console)
        if sized is None:
            return 2
        out = sized
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
        args.json.write_text(json.dumps(tidy(out), indent=1, default=str), encoding="utf-8")
        console.print(f"report: {args.json}")
    return 0


def _size(args: argparse.Namespace, config: SimConfig, console: Console) -> dict[str, Any] | None:
    """``--size``: the cheapest fleet per policy, printed side by side (None: bad input)."""
    try:
        prices = dict(config.gpu_hour_usd) | _prices(args.gpu_price)
        config = config.model_copy(update={"gpu_hour_usd": prices})
        total = args.total_rps or sum(r.rate for r in config.regions)
        slo = Slo(
            p99_ms=args.slo_ms,
            p95_ms=args.slo_p95_ms,
            hard_p99_ms=args.hard_slo_ms,
            hard_on_edges=args.max_hard_on_edges,
        )
        sizer = Sizer(config, total, slo, log=lambda m: console.print(f"[dim]{m}"))
        sized = [sizer.size(p, args.max_edges, args.max_replicas) for p in args.policy or POLICIES]
    except ValueError as exc:  # a malformed --gpu-price, a GPU kind without a price
        console.print(f"[red]{exc}")
        return None
    rows = compare(sized, total)
    _print_sizing(rows, console, title=f"cheapest fleet for {slo}, {total:g} req/s")
    return {
        "total_rps": total,
        "slo": str(slo),
        "gpu_hour_usd": prices,
        "rows": rows,
        "runs": sized,
    }


def _prices(items: list[str]) -> dict[str, float]:
    out: dict[str, float] = {}
    for item in items:
        kind, sep, usd = item.partition("=")
        try:
            out[kind.strip()] = float(usd)
        except ValueError:
            sep = ""
        if not sep or not kind.strip():
            raise ValueError(f"--gpu-price wants KIND=USD (e.g. H100=12.29), got {item!r}")
    return out


_f = fmt_ms


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


def _print_sizing(rows: list[dict[str, Any]], console: Console, title: str) -> None:
    table = Table(title=title)
    cols = ["policy", "edges/region", "center replicas", "GPUs edge+center", "$/hour"]
    cols += ["$/M requests"]
    cols += ["vs all-center", "same-city TTFT p50/p95/p99 ms", "TPOT p50 ms", "to edges"]
    for col in cols:
        table.add_column(col, justify="right")
    for row in rows:
        if not row["feasible"]:
            big, t = row["largest"]["fleet"], row["largest"]["ttft_ms"]
            table.add_row(
                row["policy"],
                f"[red]none ({big['edges_per_region']})",
                f"[red]none ({big['center_replicas']})",
                "",
                "",
                "",
                "",
                f"[red]{_f(t['p50'])}/{_f(t['p95'])}/{_f(t['p99'])}",
            )
            continue
        t = row["ttft_ms"]
        ratio = row["vs_all_center"]
        table.add_row(
            row["policy"],
            str(row["edges_per_region"]),
            str(row["center_replicas"]),
            f"{row['edge_gpus']}+{row['center_gpus']}",
            f"{row['usd_per_hour']:,.0f}",
            f"{row['usd_per_million']:,.2f}",
            "-" if ratio is None else f"{ratio:.2f}",
            f"{_f(t['p50'])}/{_f(t['p95'])}/{_f(t['p99'])}",
            _f(row["tpot_ms"]["p50"]),
            f"{row['edge_share']:.0%}",
        )
    console.print(table)
    if not all(row["feasible"] for row in rows):
        console.print(
            "none (n): no fleet up to n edges per region and n center replicas meets the SLO; "
            "its latency is that largest fleet's"
        )
