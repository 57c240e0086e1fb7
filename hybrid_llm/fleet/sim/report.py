"""What a simulation run says: latency percentiles by tier, utilisation and GPU
count per tier; and its figures rounded to what they mean."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from hybrid_llm.bench.stats import percentile
from hybrid_llm.fleet.sim.request import SimRequest
from hybrid_llm.fleet.sim.simulation import SimResult

__all__ = ["fmt_ms", "summarize_result", "tidy"]

# Significant digits a simulated figure carries: its seed alone moves a P99 by
# more than a part in a thousand.
DIGITS = 4


def fmt_ms(value: float | None) -> str:
    """A latency in ms as printed: tenths below 100 ms, whole ms above; '-' for none."""
    if value is None:
        return "-"
    return f"{value:.1f}" if abs(value) < 100 else f"{value:.0f}"


def tidy(value: Any, digits: int = DIGITS) -> Any:
    """``value`` with every float rounded to ``digits`` significant digits (for reports)."""
    if isinstance(value, float):
        if value == 0 or not math.isfinite(value):
            return value
        return round(value, digits - 1 - math.floor(math.log10(abs(value))))
    if isinstance(value, dict):
        return {k: tidy(v, digits) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [tidy(v, digits) for v in value]
    return value


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
    hard = [r for r in window if r.hard]
    hard_on_edges = sum(
        1 for r in hard if r.winner and r.winner.instance and r.winner.instance.tier == "edge"
    )
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
        # Hard requests belong on the center's model; an edge answering one is a
        # fallback that costs quality, not a route the policy chose.
        "hard": _latency(hard) | {"on_edges": hard_on_edges / len(hard) if hard else 0.0},
        "by_tier": {k: _latency(v) for k, v in sorted(by_tier.items())},
        "by_region": {k: _latency(v)["ttft_ms"] for k, v in sorted(by_region.items())},
        "tiers": tiers,
        "events": result.events,
    }
