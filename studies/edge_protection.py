"""Edge-side TTFT protections in the simulator, before and after, on one fixed fleet.

    flock bench.lock .venv/bin/python -m studies.edge_protection \\
        [--config deploy/sim/geo-national.yaml] [--edges 9] [--replicas 5] [--seeds 1 2 3 4 5]

Runs the preset's hybrid policy on a fixed fleet (``--edges`` per region,
``--replicas`` center replicas: by default the cheapest hybrid fleet of the
national preset in ``studies/simulate.results.md``) with each protection of
:class:`hybrid_llm.fleet.sim.EdgeProtection` alone and in pairs, and prints
one row per variant: same-city TTFT P50/P95/P99 (the first seed's; the P99
range over all seeds), TPOT P50, hard requests' TTFT P99, the share of
requests the edges answered, the same-city requests an edge answered after
queueing for a slot, fallbacks, and the fleet's price per hour.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from hybrid_llm.fleet.sim import EdgeProtection, SimConfig, Simulation, summarize_result
from hybrid_llm.fleet.sim.report import fmt_ms
from hybrid_llm.fleet.sim.sizing import fleet_price
from servekit.config import load_settings

VARIANTS: dict[str, EdgeProtection] = {
    "off": EdgeProtection(),
    "cap 16 (= slots, no queue)": EdgeProtection(max_decoders=16),
    "cap 12": EdgeProtection(max_decoders=12),
    "cap 8": EdgeProtection(max_decoders=8),
    "chunk 512": EdgeProtection(prefill_chunk_tokens=512),
    "chunk 128": EdgeProtection(prefill_chunk_tokens=128),
    "budget 200": EdgeProtection(ttft_budget_ms=200),
    "budget 100": EdgeProtection(ttft_budget_ms=100),
    "chunk 128 + budget 200": EdgeProtection(prefill_chunk_tokens=128, ttft_budget_ms=200),
}


def fixed_fleet(config: SimConfig, edges: int, replicas: int) -> SimConfig:
    regions = [r.model_copy(update={"edges": edges}) for r in config.regions]
    center = config.center.model_copy(update={"replicas": replicas})
    return config.model_copy(update={"regions": regions, "center": center})


def run(config: SimConfig, guard: EdgeProtection, seed: int) -> dict[str, Any]:
    cfg = config.model_copy(update={"edge_protection": guard, "seed": seed})
    result = Simulation(cfg).run()
    summary = summarize_result(result)
    window = [r for r in result.requests if result.measured_from <= r.arrival < result.measured_to]
    # Same-city requests an edge answered after queueing for one of its slots.
    summary["slot_waits"] = sum(
        1
        for r in window
        if not r.hard
        and r.winner is not None
        and r.winner.instance is not None
        and r.winner.instance.tier == "edge"
        and r.winner.admitted > r.winner.sent + r.winner.rtt / 2 + 1e-9
    )
    return summary


def row(name: str, runs: list[dict[str, Any]], usd_per_hour: float | None) -> list[str]:
    first = runs[0]
    ttft = first["same_city"]["ttft_ms"]
    served = sum(t["requests"] for t in first["by_tier"].values())
    to_edges = first["by_tier"].get("edge", {}).get("requests", 0) / max(1, served)
    p99s = [r["same_city"]["ttft_ms"]["p99"] for r in runs]
    return [
        name,
        f"{fmt_ms(ttft['p50'])}/{fmt_ms(ttft['p95'])}/{fmt_ms(ttft['p99'])}",
        f"{fmt_ms(min(p99s))}-{fmt_ms(max(p99s))}",
        fmt_ms(first["all"]["tpot_ms"]["p50"]),
        fmt_ms(first["hard"]["ttft_ms"]["p99"]),
        f"{to_edges:.0%}",
        f"{first['slot_waits']}",
        f"{first['fallbacks']}/{first['failed']}",
        "-" if usd_per_hour is None else f"{usd_per_hour:,.0f}",
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", type=Path, default=Path("deploy/sim/geo-national.yaml"))
    parser.add_argument("--edges", type=int, default=9, help="edges per region")
    parser.add_argument("--replicas", type=int, default=5, help="center replicas")
    parser.add_argument("--seeds", type=int, nargs="+", default=[1, 2, 3, 4, 5])
    parser.add_argument("--duration", type=float, help="override duration_s")
    parser.add_argument("--variant", action="append", choices=list(VARIANTS))
    args = parser.parse_args()
    config = load_settings(SimConfig, args.config, duration_s=args.duration)
    config = fixed_fleet(config, args.edges, args.replicas)
    usd = fleet_price(config, args.edges, args.replicas)["usd_per_hour"]
    table = Table(
        title=f"{args.config.name}, hybrid, {args.edges} edges/region + {args.replicas} "
        f"replicas, {config.duration_s:g} s, seeds {' '.join(map(str, args.seeds))}"
    )
    cols = ["edges protect by", "same-city TTFT p50/p95/p99 ms", "p99 over seeds"]
    cols += ["TPOT p50 ms", "hard TTFT p99 ms", "to edges", "queued for a slot"]
    cols += ["fallback/fail", "$/hour"]
    for col in cols:
        table.add_column(col, justify="right")
    for name in args.variant or list(VARIANTS):
        runs = [run(config, VARIANTS[name], seed) for seed in args.seeds]
        table.add_row(*row(name, runs, usd))
    Console(width=160).print(table)


if __name__ == "__main__":
    main()
