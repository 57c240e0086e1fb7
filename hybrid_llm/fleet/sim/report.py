"""What a simulation run says: latency percentiles by tier, utilisation and GPU
count per tier; and the sizing search built on it."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Any

from hybrid_llm.bench.stats import percentile
from hybrid_llm.fleet.sim.config import SimConfig
from hybrid_llm.fleet.sim.request import SimRequest
from hybrid_llm.fleet.sim.simulation import SimResult, Simulation

__all__ = ["size_edges", "summarize_result"]


def _dist_ms(values: Sequence[float | None]) -> dict[str, float | None]:
    vals = [v * 1000.0 for v in values if v is not None]
    return {f"p{q}": percentile(vals, q) for q in (50, 95, 99)} | {"n": float(len(vals))}


def _latency(reqs: Sequence[SimRequest]) -> dict[str, Any]:
    return {
        "requests": len(reqs),
        "ttft_ms": _dist_ms([r.ttft for r in reqs]),
        "tpot_ms": _dist_ms([r.tpot for r in reqs]),
        "e2e_ms": _dist_ms([r.e2e for r in reqs]),
    }


def summarize_result(result: SimResult) -> dict[str, Any]:
    """The run's report: overall, same-city (simple requests), per tier, per region."""
    window = [r for r in result.requests if result.measured_from <= r.arrival < result.measured_to]
    served = [r for r in window if r.winner is not None and r.winner.instance is not None]
    by_tier: dict[str, list[SimRequest]] = {}
    by_region: dict[str, list[SimRequest]] = {}
    for r in served:
        instance = r.winner.instance if r.winner is not None else None
        if instance is not None:
            by_tier.setdefault(instance.tier, []).append(r)
    for r in window:
        if not r.hard:
            by_region.setdefault(r.region, []).append(r)
    tiers: dict[str, dict[str, float]] = {}
    period = max(result.measured_to - result.measured_from, 1e-9)
    for inst in result.instances:
        t = tiers.setdefault(inst.tier, {"instances": 0, "gpus": 0, "busy": 0.0, "occupancy": 0.0})
        (busy0, occ0), (busy1, occ1) = inst.marks
        t["instances"] += 1
        t["gpus"] += inst.profile.gpus
        # busy: share of time the engine computed anything; occupancy: share of its
        # batch slots in use (a batched engine is "busy" long before it is full).
        t["busy"] += (busy1 - busy0) / period
        t["occupancy"] += (occ1 - occ0) / (period * inst.profile.slots)
    for t in tiers.values():
        t["busy"] /= t["instances"]
        t["occupancy"] /= t["instances"]
    simple = [r for r in window if not r.hard]
    return {
        "policy": result.config.policy.name,
        "offered_rps": sum(r.rate for r in result.config.regions),
        "measured_requests": len(window),
        "failed": sum(r.failed for r in window),
        "unfinished": sum(1 for r in window if r.e2e is None and not r.failed),
        "fallbacks": sum(r.fallbacks for r in window),
        "hedged": sum(r.hedged for r in window),
        "all": _latency(served),
        "same_city": _latency(simple),
        "by_tier": {k: _latency(v) for k, v in sorted(by_tier.items())},
        "by_region": {k: _latency(v)["ttft_ms"] for k, v in sorted(by_region.items())},
        "tiers": tiers,
        "events": result.events,
    }


def size_edges(
    config: SimConfig,
    total_rps: float,
    *,
    slo_ms: float = 200.0,
    max_edges: int = 100,
    metric: Callable[[dict[str, Any]], float | None] = lambda s: s["same_city"]["ttft_ms"]["p99"],
    log: Callable[[str], None] = lambda _m: None,
) -> dict[str, Any]:
    """Fewest edges per region (same in every region) keeping ``metric`` under ``slo_ms``.

    The offered ``total_rps`` is split over regions in proportion to their
    configured rates. Binary search over 1..max_edges (the metric falls as
    edges are added); each probe is one full simulation.
    """
    weights = [r.rate for r in config.regions]
    scale = total_rps / sum(weights) if sum(weights) else 0.0

    def probe(edges: int) -> dict[str, Any]:
        regions = [
            r.model_copy(update={"edges": edges, "rate": r.rate * scale}) for r in config.regions
        ]
        cfg = config.model_copy(update={"regions": regions})
        t0 = time.perf_counter()
        summary = summarize_result(Simulation(cfg).run())
        value = metric(summary)
        log(
            f"edges/region={edges}: same-city P99 TTFT {value} ms ({time.perf_counter() - t0:.1f}s)"
        )
        summary["edges_per_region"] = edges
        return summary

    def ok(summary: dict[str, Any]) -> bool:
        value = metric(summary)
        return value is not None and value < slo_ms

    started = time.perf_counter()
    probes: dict[int, dict[str, Any]] = {}
    lo, hi = 1, max_edges
    probes[hi] = probe(hi)
    if not ok(probes[hi]):
        return {
            "feasible": False,
            "edges_per_region": None,
            "at_max": probes[hi],
            "runtime_s": time.perf_counter() - started,
            "probes": len(probes),
        }
    while lo < hi:
        mid = (lo + hi) // 2
        probes[mid] = probe(mid)
        if ok(probes[mid]):
            hi = mid
        else:
            lo = mid + 1
    best = probes[hi]
    return {
        "feasible": True,
        "edges_per_region": hi,
        "slo_ms": slo_ms,
        "total_rps": total_rps,
        "result": best,
        "runtime_s": time.perf_counter() - started,
        "probes": len(probes),
    }
