"""Simulator speed: the sizing question for 10 regions x 100 edges.

    .venv/bin/python bench/sim_sizing.py [--total-rps 1000]

Prints the answer (edges per region for same-city P99 TTFT < 200 ms), the
number of simulations the search ran and the wall time, measured in this run.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

from hybrid_llm.sim import SimConfig, Simulation, size_edges, summarize_result
from servekit.config import load_settings

CONFIG = Path(__file__).resolve().parents[1] / "deploy" / "sim" / "fleet-10x100.yaml"


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--total-rps", type=float, default=1000.0)
    parser.add_argument("--config", type=Path, default=CONFIG)
    args = parser.parse_args()
    config = load_settings(SimConfig, args.config)
    edges = sum(r.edges for r in config.regions)
    print(
        f"fleet: {len(config.regions)} regions, {edges} edges, {config.duration_s:.0f}s simulated"
    )

    t0 = time.perf_counter()
    summary = summarize_result(Simulation(config).run())
    one = time.perf_counter() - t0
    print(
        f"one run ({config.policy.name}, {summary['offered_rps']:.0f} req/s): {one:.2f}s wall, "
        f"{summary['events']} events ({summary['events'] / one:,.0f} events/s)"
    )

    out = size_edges(config, args.total_rps, slo_ms=200.0, max_edges=100, log=print)
    p99 = out["result"]["same_city"]["ttft_ms"]["p99"] if out["feasible"] else None
    print(
        f"sizing at {args.total_rps:.0f} req/s: {out['edges_per_region']} edges/region "
        f"(same-city P99 TTFT {p99 and round(p99, 1)} ms), {out['probes']} simulations, "
        f"{out['runtime_s']:.1f}s wall"
    )


if __name__ == "__main__":
    main()
