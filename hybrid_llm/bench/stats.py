"""Percentiles, per-step summaries and the knee of the latency–load curve."""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from typing import Any

from hybrid_llm.bench.client import RequestRecord

__all__ = ["find_knee", "percentile", "prediction_error", "summarize"]

QUANTILES = (50, 95, 99)


def percentile(values: Sequence[float], q: float) -> float | None:
    """Linear-interpolated percentile (numpy's default method); ``None`` if empty."""
    if not values:
        return None
    ordered = sorted(values)
    pos = (len(ordered) - 1) * q / 100.0
    lo = math.floor(pos)
    hi = min(lo + 1, len(ordered) - 1)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (pos - lo)


def _dist_ms(values: Iterable[float | None]) -> dict[str, float | None]:
    vals = [v * 1000.0 for v in values if v is not None]
    out: dict[str, float | None] = {f"p{q}": percentile(vals, q) for q in QUANTILES}
    out["mean"] = sum(vals) / len(vals) if vals else None
    return out


def _summary(records: Sequence[RequestRecord], wall: float) -> dict[str, Any]:
    ok = [r for r in records if r.ok]
    tokens = sum(r.output_tokens for r in ok)
    errors: dict[str, int] = {}
    for r in records:
        if not r.ok:
            key = r.error.split(":")[0] if r.error else "unknown"
            errors[key] = errors.get(key, 0) + 1
    routed = [r for r in ok if r.tier != "-"]
    shares: dict[str, float] = {}
    if routed:
        for tier in ("edge", "center"):
            shares[tier] = sum(1 for r in routed if r.tier == tier) / len(routed)
        shares["same_city"] = sum(1 for r in routed if r.same_city) / len(routed)
    return {
        "requests": len(records),
        "ok": len(ok),
        # Of the answered requests the router routed: per tier, and served in the user's region.
        "route_shares": shares,
        "shed": sum(1 for r in records if r.status == 429),
        "server_errors": sum(1 for r in records if r.status >= 500),
        "error_rate": (len(records) - len(ok)) / len(records) if records else 0.0,
        "errors": errors,
        "requests_per_s": len(ok) / wall if wall > 0 else 0.0,
        "output_tokens_per_s": tokens / wall if wall > 0 else 0.0,
        "output_tokens": tokens,
        "ttft_ms": _dist_ms(r.ttft for r in ok),
        "tpot_ms": _dist_ms(r.tpot for r in ok),
        "itl_ms": _dist_ms(gap for r in ok for gap in r.itl),
        "e2e_ms": _dist_ms(r.e2e for r in ok),
        "prediction": prediction_error(ok),
    }


def prediction_error(records: Iterable[RequestRecord]) -> dict[str, Any]:
    """The router's predicted TTFT against the measured one, over the answered
    requests that carried a prediction: mean and median absolute percentage error,
    the share the router under-predicted (the measured TTFT was longer); the same
    for the requests whose instance the router had learned (they carry a P90),
    with the share of them within their P90."""
    pairs = [(r.predicted_ttft, r.ttft, r.predicted_ttft_p90) for r in records]
    scored = [(p, t, p90) for p, t, p90 in pairs if p is not None and t is not None and t > 0]
    out = _errors([(p, t) for p, t, _ in scored])
    learned = [(p, t, p90) for p, t, p90 in scored if p90 is not None]
    out["learned"] = _errors([(p, t) for p, t, _ in learned])
    out["learned"]["within_p90"] = (
        sum(1 for _, t, p90 in learned if t <= p90) / len(learned) if learned else None
    )
    return out


def _errors(pairs: Sequence[tuple[float, float]]) -> dict[str, Any]:
    errors = [abs(p - t) / t for p, t in pairs]
    return {
        "n": len(errors),
        "mape": sum(errors) / len(errors) if errors else None,
        "median_ape": percentile(errors, 50),
        "under_share": sum(1 for p, t in pairs if t > p) / len(errors) if errors else None,
    }


def summarize(records: Sequence[RequestRecord], wall: float) -> dict[str, Any]:
    """The step's totals, plus the same per route (``tier/region``) and per workload
    (a conversation workload's name, or a length bucket)."""
    out = _summary(records, wall)
    routes: dict[str, list[RequestRecord]] = {}
    buckets: dict[str, list[RequestRecord]] = {}
    for r in records:
        routes.setdefault(f"{r.tier}/{r.region}", []).append(r)
        buckets.setdefault(r.bucket, []).append(r)
    out["by_route"] = {k: _summary(v, wall) for k, v in sorted(routes.items())}
    out["by_bucket"] = {k: _summary(v, wall) for k, v in sorted(buckets.items())}
    reasons: dict[str, int] = {}
    for r in records:
        reasons[r.reason] = reasons.get(r.reason, 0) + 1
    out["route_reasons"] = reasons
    return out


def find_knee(load: Sequence[float], latency: Sequence[float]) -> int | None:
    """Index of the knee of an increasing, convex latency–load curve (Kneedle).

    Both axes are scaled to [0, 1]; the knee is where the curve falls furthest
    below the chord from first to last point, i.e. the last load before latency
    starts climbing faster than load. ``None`` with fewer than three points or
    a curve that never bends upward.
    """
    index = [i for i, y in enumerate(latency) if not math.isnan(y)]
    if len(index) < 3:
        return None
    xs, ys = [load[i] for i in index], [latency[i] for i in index]
    x_span, y_span = max(xs) - min(xs), max(ys) - min(ys)
    if x_span <= 0 or y_span <= 0:
        return None
    xn = [(x - xs[0]) / x_span for x in xs]
    yn = [(y - min(ys)) / y_span for y in ys]
    diff = [x - y for x, y in zip(xn, yn, strict=True)]
    best = max(range(len(diff)), key=diff.__getitem__)
    if diff[best] <= 0.05 or best in (0, len(diff) - 1):
        return None
    return index[best]
