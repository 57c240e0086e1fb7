"""Sizing on the simulator: the cheapest fleet that keeps same-city TTFT under an SLO.

A fleet is a count of edges per region (the same in every region) and of
center replicas; its price is their GPUs times ``gpu_hour_usd``. Each probe
is one full simulation at the offered demand (split over regions by their
configured rates), judged on the same-city TTFT P99 and, when set, P95.

The searches assume what the probes mostly show: more edges or more replicas
never make the tail worse. ``all-center`` bisects the replicas. The hybrid
policies first bisect the fewest replicas that meet the SLO with
``max_edges`` per region, then for each replica count from there bisect the
fewest edges (never more than at the count before); they stop when the next
replica alone costs more than the cheapest fleet found. A center replica
costs as much as dozens of edges, so that takes a few counts.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from hybrid_llm.fleet.sim.config import PolicyName, SimConfig
from hybrid_llm.fleet.sim.report import fmt_ms, summarize_result
from hybrid_llm.fleet.sim.simulation import Simulation

__all__ = ["Sizer", "Slo", "compare", "fewest", "fleet_price", "size_edges", "unpriced"]

Log = Callable[[str], None]


def _quiet(_message: str) -> None:
    return None


@dataclass(frozen=True)
class Slo:
    """Same-city TTFT bounds in ms (None: not judged), and what hard requests may
    not lose: at most ``hard_on_edges`` of them answered by an edge (a starved
    center pushes them there; hedging alone lands about 1% there, racing an edge
    against an ample center), their TTFT P99 under ``hard_p99_ms``."""

    p99_ms: float | None = 200.0
    p95_ms: float | None = None
    hard_p99_ms: float | None = None
    hard_on_edges: float = 0.05

    def met(self, summary: dict[str, Any]) -> bool:
        ttft, hard = summary["same_city"]["ttft_ms"], summary["hard"]
        bounds = [(ttft["p99"], self.p99_ms), (ttft["p95"], self.p95_ms)]
        if hard["requests"]:
            bounds.append((hard["ttft_ms"]["p99"], self.hard_p99_ms))
        for value, bound in bounds:
            if bound is not None and (value is None or value >= bound):
                return False
        return bool(summary["failed"] == 0 and hard["on_edges"] <= self.hard_on_edges)

    def __str__(self) -> str:
        parts = [f"P{q} < {b:g} ms" for q, b in ((99, self.p99_ms), (95, self.p95_ms)) if b]
        same_city = " and ".join(parts) or "no bound"
        hard = f"P99 < {self.hard_p99_ms:g} ms, " if self.hard_p99_ms else ""
        return (
            f"same-city TTFT {same_city}; hard requests {hard}<= {self.hard_on_edges:.0%} on edges"
        )


def unpriced(config: SimConfig) -> list[str]:
    """GPU kinds of the fleet's profiles that ``gpu_hour_usd`` has no price for."""
    kinds = {p.gpu_kind for p in (config.edge, config.center_profile) if p.gpus}
    return sorted(
        k or "(unnamed GPU of a custom profile)" for k in kinds - set(config.gpu_hour_usd)
    )


def fleet_price(config: SimConfig, edges_per_region: int, replicas: int) -> dict[str, Any]:
    """GPU counts and USD per hour (None with unpriced GPUs) of ``edges_per_region``
    in every region and ``replicas`` center replicas."""
    edges = edges_per_region * len(config.regions)
    prices = config.gpu_hour_usd
    edge, center = config.edge, config.center_profile
    usd = None
    if not unpriced(config):
        usd = edges * edge.gpus * prices.get(edge.gpu_kind, 0.0)
        usd += replicas * center.gpus * prices.get(center.gpu_kind, 0.0)
    return {
        "edges_per_region": edges_per_region,
        "edges": edges,
        "edge_gpus": edges * edge.gpus,
        "center_replicas": replicas,
        "center_gpus": replicas * center.gpus,
        "usd_per_hour": usd,
    }


def fewest(lo: int, hi: int, ok: Callable[[int], bool]) -> int | None:
    """The smallest n in [lo, hi] with ok(n), bisecting (ok is taken as monotone)."""
    if not ok(hi):
        return None
    while lo < hi:
        mid = (lo + hi) // 2
        if ok(mid):
            hi = mid
        else:
            lo = mid + 1
    return hi


class Sizer:
    """Probes fleets of one config at ``total_rps``; remembers every probe."""

    def __init__(self, config: SimConfig, total_rps: float, slo: Slo, *, log: Log = _quiet) -> None:
        weights = sum(r.rate for r in config.regions)
        self.scale = total_rps / weights if weights else 0.0
        self.config = config
        self.total_rps = total_rps
        self.slo = slo
        self.log = log
        self.probes: dict[tuple[str, int, int], dict[str, Any]] = {}

    def probe(self, policy: PolicyName, edges: int, replicas: int) -> dict[str, Any]:
        key = (policy, edges, replicas)
        if key in self.probes:
            return self.probes[key]
        cfg = self.config
        regions = [
            r.model_copy(update={"edges": edges, "rate": r.rate * self.scale}) for r in cfg.regions
        ]
        cfg = cfg.model_copy(
            update={
                "regions": regions,
                "center": cfg.center.model_copy(update={"replicas": replicas}),
                "policy": cfg.policy.model_copy(update={"name": policy}),
            }
        )
        t0 = time.perf_counter()
        summary = summarize_result(Simulation(cfg).run())
        summary["ok"] = self.slo.met(summary)
        summary["fleet"] = fleet_price(cfg, edges, replicas)
        t, hard = summary["same_city"]["ttft_ms"], summary["hard"]
        self.log(
            f"{policy} edges/region={edges} replicas={replicas}: same-city TTFT P95/P99 "
            f"{fmt_ms(t['p95'])}/{fmt_ms(t['p99'])} ms, hard P99 {fmt_ms(hard['ttft_ms']['p99'])} "
            f"ms ({hard['on_edges']:.0%} on edges), "
            f"{'meets' if summary['ok'] else 'misses'} the SLO ({time.perf_counter() - t0:.1f}s)"
        )
        self.probes[key] = summary
        return summary

    def ok(self, policy: PolicyName, edges: int, replicas: int) -> bool:
        return bool(self.probe(policy, edges, replicas)["ok"])

    def _edges_ok(self, policy: PolicyName, replicas: int, edges: int) -> bool:
        return self.ok(policy, edges, replicas)

    def size(self, policy: PolicyName, max_edges: int, max_replicas: int) -> dict[str, Any]:
        """The cheapest SLO-meeting fleet for ``policy``: its probe, or why there is none."""
        missing = unpriced(self.config)
        if missing:
            raise ValueError(f"gpu_hour_usd has no price for {', '.join(missing)}")
        started, before = time.perf_counter(), len(self.probes)
        best: dict[str, Any] | None = None
        if policy == "all-center":
            n = fewest(1, max_replicas, lambda c: self.ok(policy, 0, c))
            best = None if n is None else self.probe(policy, 0, n)
        else:
            c_min = fewest(1, max_replicas, lambda c: self.ok(policy, max_edges, c))
            edges_cap = max_edges
            for c in range(c_min or max_replicas + 1, max_replicas + 1):
                floor = fleet_price(self.config, 1, c)["usd_per_hour"]
                if best is not None and floor >= best["fleet"]["usd_per_hour"]:
                    break  # more replicas cost more than the cheapest fleet found
                e = fewest(1, edges_cap, functools.partial(self._edges_ok, policy, c))
                if e is None:
                    continue
                found = self.probe(policy, e, c)
                if best is None or found["fleet"]["usd_per_hour"] < best["fleet"]["usd_per_hour"]:
                    best = found
                edges_cap = e
                if e == 1:
                    break
        largest = self.probe(policy, 0 if policy == "all-center" else max_edges, max_replicas)
        return {
            "policy": policy,
            "feasible": best is not None,
            "result": best,
            # What the largest fleet within the bounds reaches: a tail that more GPUs
            # do not lower is set by RTT or prefill, not capacity.
            "largest": {"fleet": largest["fleet"], "ttft_ms": largest["same_city"]["ttft_ms"]},
            "probes": len(self.probes) - before,
            "runtime_s": time.perf_counter() - started,
        }


def size_edges(
    config: SimConfig,
    total_rps: float,
    *,
    slo_ms: float = 200.0,
    max_edges: int = 100,
    log: Log = _quiet,
) -> dict[str, Any]:
    """Fewest edges per region (same in every region) keeping same-city P99 TTFT
    under ``slo_ms`` with the configured center and policy (bisection over
    1..max_edges; each probe is one full simulation)."""
    sizer = Sizer(config, total_rps, Slo(p99_ms=slo_ms), log=log)
    replicas, policy = config.center.replicas, config.policy.name
    started = time.perf_counter()
    n = fewest(1, max_edges, lambda e: sizer.ok(policy, e, replicas))
    out: dict[str, Any] = {
        "feasible": n is not None,
        "edges_per_region": n,
        "slo_ms": slo_ms,
        "total_rps": total_rps,
        "runtime_s": time.perf_counter() - started,
        "probes": len(sizer.probes),
    }
    if n is None:
        out["at_max"] = sizer.probe(policy, max_edges, replicas) | {"edges_per_region": max_edges}
    else:
        out["result"] = sizer.probe(policy, n, replicas) | {"edges_per_region": n}
    return out


def compare(sized: Sequence[dict[str, Any]], total_rps: float) -> list[dict[str, Any]]:
    """Rows for the side-by-side table: price per hour and per million requests,
    and each policy's price over all-center's."""
    base = next(
        (
            s["result"]["fleet"]["usd_per_hour"]
            for s in sized
            if s["policy"] == "all-center" and s["feasible"]
        ),
        None,
    )
    rows = []
    for s in sized:
        row: dict[str, Any] = {"policy": s["policy"], "feasible": s["feasible"]}
        row["largest"] = s["largest"]
        if s["feasible"]:
            res = s["result"]
            usd = res["fleet"]["usd_per_hour"]
            row |= res["fleet"]
            row["usd_per_million"] = usd / (total_rps * 3600) * 1e6 if total_rps else None
            row["vs_all_center"] = usd / base if base else None
            row["ttft_ms"] = res["same_city"]["ttft_ms"]
            row["tpot_ms"] = res["all"]["tpot_ms"]
            row["edge_share"] = res["by_tier"].get("edge", {}).get("requests", 0) / max(
                1, res["all"]["requests"]
            )
            row["occupancy"] = {k: v["occupancy"] for k, v in res["tiers"].items()}
        rows.append(row)
    return rows
