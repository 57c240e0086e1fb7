"""The run report: JSON document, knee per variant, baseline comparison, table."""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from typing import Any

from rich.console import Console
from rich.table import Table

from hybrid_llm.bench.runner import RunPlan, StepRun
from hybrid_llm.bench.stats import find_knee, summarize

__all__ = ["Regression", "build_report", "compare", "print_report"]

# (metric path, higher is worse?) compared against a baseline.
COMPARED: tuple[tuple[str, bool], ...] = (
    ("ttft_ms.p50", True),
    ("ttft_ms.p95", True),
    ("ttft_ms.p99", True),
    ("tpot_ms.p50", True),
    ("tpot_ms.p99", True),
    ("e2e_ms.p50", True),
    ("e2e_ms.p99", True),
    ("requests_per_s", False),
    ("output_tokens_per_s", False),
)


def build_report(plan: RunPlan, runs: list[StepRun], knee_metric: str) -> dict[str, Any]:
    steps: list[dict[str, Any]] = []
    for run in runs:
        steps.append(
            {
                "step": run.step.label,
                "mode": run.step.mode,
                "load": run.step.value,
                "variant": run.variant,
                "wall_s": run.wall,
                "summary": summarize(run.records, run.wall),
                "requests": [r.to_dict() for r in run.records],
            }
        )
    knees: dict[str, Any] = {}
    for variant in plan.variants:
        mine = [s for s in steps if s["variant"] == variant.name]
        loads = [float(s["load"]) for s in mine]
        lat = [_get(s["summary"], knee_metric) for s in mine]
        idx = find_knee(loads, [math.nan if v is None else v for v in lat])
        knees[variant.name] = (
            None
            if idx is None
            else {"step": mine[idx]["step"], "load": loads[idx], knee_metric: lat[idx]}
        )
    return {
        "meta": {
            "url": ",".join((plan.url, *plan.more_urls)),
            "model": plan.workload.model,
            "api": plan.workload.api,
            "workload": plan.workload.labels,
            "duration_s": plan.duration,
            "max_requests": plan.max_requests,
            "variants": {v.name: {"headers": v.headers, "model": v.model} for v in plan.variants},
            "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "knee_metric": knee_metric,
        },
        "steps": steps,
        "knee": knees,
    }


def _get(summary: dict[str, Any], path: str) -> float | None:
    node: Any = summary
    for part in path.split("."):
        if not isinstance(node, dict) or part not in node:
            return None
        node = node[part]
    return float(node) if isinstance(node, int | float) else None


@dataclass(frozen=True)
class Regression:
    step: str
    variant: str
    metric: str
    baseline: float
    current: float

    def __str__(self) -> str:
        change = (self.current - self.baseline) / self.baseline * 100 if self.baseline else 0.0
        return (
            f"{self.variant} {self.step} {self.metric}: {self.baseline:.2f} -> "
            f"{self.current:.2f} ({change:+.1f}%)"
        )


def compare(
    current: dict[str, Any],
    baseline: dict[str, Any],
    *,
    tolerance: float = 0.10,
    min_delta_ms: float = 2.0,
    max_error_rate_rise: float = 0.01,
) -> list[Regression]:
    """Metrics of matching (variant, step) pairs that got worse beyond ``tolerance``.

    Latencies also need to move by ``min_delta_ms`` so sub-millisecond jitter on a
    fast target is not a regression.
    """
    base = {(s["variant"], s["step"]): s["summary"] for s in baseline.get("steps", [])}
    found: list[Regression] = []
    for step in current["steps"]:
        key = (step["variant"], step["step"])
        if key not in base:
            continue
        old, new = base[key], step["summary"]
        for metric, higher_worse in COMPARED:
            b, c = _get(old, metric), _get(new, metric)
            if b is None or c is None:
                continue
            if higher_worse:
                worse = c > b * (1 + tolerance) and c - b >= min_delta_ms
            else:
                worse = c < b * (1 - tolerance)
            if worse:
                found.append(Regression(key[1], key[0], metric, b, c))
        b_err, c_err = old.get("error_rate", 0.0), new.get("error_rate", 0.0)
        if c_err - b_err > max_error_rate_rise:
            found.append(Regression(key[1], key[0], "error_rate", b_err, c_err))
    return found


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f}"


def _shares(shares: dict[str, float]) -> str:
    if not shares:
        return "-"
    return f"{shares['edge'] * 100:.0f}%/{shares['same_city'] * 100:.0f}%"


def _prediction(error: dict[str, Any] | None) -> str:
    """The router's TTFT prediction error (``X-Route-Predicted-Ttft-Ms``): MAPE and
    share under-predicted, then the same over the requests its learned model
    predicted and the share of those within their P90; empty without predictions."""
    if not error or not error.get("n"):
        return ""
    text = (
        f"MAPE {error['mape'] * 100:.0f}%, under-predicted {error['under_share'] * 100:.0f}%"
        f" of {error['n']}"
    )
    learned = error.get("learned") or {}
    if learned.get("n"):
        text += (
            f"; learned: MAPE {learned['mape'] * 100:.0f}%, under-predicted"
            f" {learned['under_share'] * 100:.0f}%, within P90"
            f" {learned['within_p90'] * 100:.0f}% of {learned['n']}"
        )
    return text


def print_report(report: dict[str, Any], console: Console) -> None:
    table = Table(title=f"hybrid-llm bench {report['meta']['url']}")
    for col in ("variant", "step", "route", "ok/n", "err%", "429", "edge/same-city", "req/s"):
        table.add_column(col, justify="right")
    for col in ("TTFT p50/p95/p99", "TPOT p50/p99", "ITL p50/p99", "E2E p50/p99 ms"):
        table.add_column(col, justify="right")
    for step in report["steps"]:
        summary = step["summary"]
        rows = [("all", summary)]
        if len(summary["by_route"]) > 1 or "-/-" not in summary["by_route"]:
            rows += list(summary["by_route"].items())
        if len(summary["by_bucket"]) > 1:
            rows += [(f"[{name}]", s) for name, s in summary["by_bucket"].items()]
        for route, s in rows:
            t, tp, itl, e = s["ttft_ms"], s["tpot_ms"], s["itl_ms"], s["e2e_ms"]
            table.add_row(
                step["variant"] if route == "all" else "",
                step["step"] if route == "all" else "",
                route,
                f"{s['ok']}/{s['requests']}",
                f"{s['error_rate'] * 100:.1f}",
                str(s["shed"]),
                _shares(s["route_shares"]),
                f"{s['requests_per_s']:.2f}",
                f"{_ms(t['p50'])}/{_ms(t['p95'])}/{_ms(t['p99'])}",
                f"{_ms(tp['p50'])}/{_ms(tp['p99'])}",
                f"{_ms(itl['p50'])}/{_ms(itl['p99'])}",
                f"{_ms(e['p50'])}/{_ms(e['p99'])}",
            )
    console.print(table)
    # Its own lines: a thirteenth column is cut from a table as wide as a terminal.
    for step in report["steps"]:
        error = _prediction(step["summary"].get("prediction"))
        if error:
            console.print(f"router TTFT prediction ({step['variant']} {step['step']}): {error}")
    for variant, knee in report["knee"].items():
        if knee:
            console.print(f"knee ({variant}): {knee['step']}")
