"""The report of the simulator check: bench and simulated percentiles side by
side, and the share of requests each route served."""

from __future__ import annotations

import statistics
from collections import Counter
from typing import Any

from hybrid_llm.bench.stats import percentile
from hybrid_llm.fleet.sim.request import SimRequest

__all__ = ["compare", "route"]


def route(tier: str, region: str) -> str:
    """Where a request was served: ``center`` or ``edge@<region>``."""
    if tier == "-":  # no router headers: straight to the engine (--edge-only)
        return "direct"
    return "center" if tier == "center" else f"{tier}@{region}"


def _pct(values: list[float], q: int) -> float:
    return percentile(values, q) or float("nan")


def _same_city_bench(record: dict[str, Any]) -> bool:
    # No router headers (straight to the engine): the user's own edge.
    return bool(record["tier"] == "-" or record["region"] == record["user_region"])


def _same_city_sim(req: SimRequest) -> bool:
    winner = req.winner.instance if req.winner is not None else None
    return winner is not None and winner.region == req.region


def _sim_pct(runs: list[list[SimRequest]], name: str, key: str, q: int) -> float:
    """The median over the runs of each run's percentile: a P99 of the bench's 40
    requests is an estimate from 40 (near its largest), and so is each replay's."""
    per_run = []
    for reqs in runs:
        kept = [r for r in reqs if _same_city_sim(r)] if name == "city TTFT" else reqs
        values = [getattr(r, key) * 1000 for r in kept if getattr(r, key) is not None]
        if values:
            per_run.append(_pct(values, q))
    return statistics.median(per_run) if per_run else float("nan")


def compare(records: list[dict[str, Any]], sims: dict[str, list[list[SimRequest]]]) -> None:
    """Percentiles of both side by side (all requests, then the TTFT of those served
    in the user's own city), and where the requests were served. A simulation is
    one or more runs (replays of the bench's requests with different seeds): its
    percentile is the median of theirs, each from as many requests as the bench's."""
    keys = (("TTFT", "ttft"), ("TPOT", "tpot"), ("E2E", "e2e"))
    bench = {n: [r[k] * 1000 for r in records if r[k] is not None] for n, k in keys}
    bench["city TTFT"] = [r["ttft"] * 1000 for r in records if _same_city_bench(r) and r["ttft"]]
    header = f"{'ms':<14}{'bench':>9}"
    for name in sims:
        header += f"{name:>24}{'diff':>8}"
    print(header)
    for name, key in (*keys, ("city TTFT", "ttft")):
        for q in (50, 95, 99):
            measured_q = _pct(bench[name], q)
            line = f"{name + ' p' + str(q):<14}{measured_q:>9.1f}"
            for runs in sims.values():
                sim_q = _sim_pct(runs, name, key, q)
                line += f"{sim_q:>24.1f}{(sim_q - measured_q) / measured_q * 100:>7.1f}%"
            print(line)
    routes_b = Counter(route(r["tier"], r["region"]) for r in records)
    direct = all(r["tier"] == "-" for r in records)
    routes_s = {
        name: Counter(
            "direct" if direct else route(r.winner.instance.tier, r.winner.instance.region)
            for reqs in runs
            for r in reqs
            if r.winner is not None and r.winner.instance is not None
        )
        for name, runs in sims.items()
    }
    print(f"{'route':<18}{'bench':>14}" + "".join(f"{name:>24}" for name in sims))
    for where in sorted(set(routes_b).union(*routes_s.values())):
        line = f"{where:<18}{routes_b[where]:>7} {routes_b[where] / len(records) * 100:>5.1f}%"
        for name, runs in sims.items():
            n = routes_s[name][where]
            line += f"{n:>17} {n / max(1, sum(map(len, runs))) * 100:>5.1f}%"
        print(line)
