"""Rollout gates: is the new version at least as good as the one it replaces?

Figures come from what nodes report in the registry: cumulative request
outcomes (``requests_ok``/``requests_failed``) and a recent TTFT P95, from
the catalog's load reports, else from ``nodes/<id>/actual``. The error rate
of a bake is the change of the counters over the bake window. The replaced
version is measured on the plan's nodes that still serve it during the same
window; when none are left (the last wave) its figures from the rollout's
start stand in. The TTFT reference is the more lenient of those nodes' P95
and the new nodes' own P95 from before the rollout: another node serves
other traffic (the same-city edge takes the router's region, and the long
pasted prompts with it), and a canary whose P95 was already that high on the
old version is not slower because of the new one (a rollout of the same
model file was rolled back on 4655 ms against another node's 2709 ms). A
configured Prometheus server can supply both figures instead
(:class:`PrometheusGate`).

Users' answer acceptance (:func:`acceptance`): the routers count ratings of
each version's answers (``POST /v1/feedback`` on the router) under
``models/<name>/feedback/<version>/<router>``; once both versions have
``min_feedback`` ratings, a new version whose acceptance rate falls more than
``max_acceptance_drop`` below the replaced one's fails the gate, however fast
it is (a quantized version can win on latency and lose on accepted answers).

Verdicts: ``pass``; ``fail`` (aborts and rolls back); ``inconclusive`` when
the new version saw too few requests to judge (pauses for an operator).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from string import Template
from typing import Literal

import httpx

from model_sync.records import FeedbackCounts, GateSettings, NodeCounters
from model_sync.store import SyncStore
from servekit.registry.protocol import Catalog

__all__ = [
    "GateResult",
    "PrometheusGate",
    "Verdict",
    "acceptance",
    "evaluate",
    "read_counters",
]

Verdict = Literal["pass", "fail", "inconclusive"]


@dataclass
class GateResult:
    verdict: Verdict
    reasons: list[str] = field(default_factory=list)
    figures: dict[str, float | int | str | None] = field(default_factory=dict)

    def summary(self) -> str:
        return "; ".join(self.reasons) if self.reasons else self.verdict


async def read_counters(
    catalog: Catalog, store: SyncStore, nodes: Iterable[str]
) -> dict[str, NodeCounters]:
    """Each node's cumulative counters and TTFT P95 (catalog first, then its actual report)."""
    wanted = set(nodes)
    out: dict[str, NodeCounters] = {}
    for inst in await catalog.instances(tier="edge", healthy_only=False):
        if inst.info.id in wanted:
            load = inst.load
            out[inst.info.id] = NodeCounters(
                ok=load.requests_ok, failed=load.requests_failed, ttft_p95_ms=load.ttft_p95_ms
            )
    for node in wanted - out.keys():
        actual = await store.actual(node)
        if actual is not None:
            out[node] = NodeCounters(
                ok=actual.requests_ok,
                failed=actual.requests_failed,
                ttft_p95_ms=actual.ttft_p95_ms,
            )
    return out


def _delta(start: NodeCounters | None, end: NodeCounters) -> tuple[int, int]:
    if start is None or end.ok < start.ok or end.failed < start.failed:
        return end.ok, end.failed  # counters restarted (a process restart): count from zero
    return end.ok - start.ok, end.failed - start.failed


def _totals(
    nodes: Iterable[str], start: Mapping[str, NodeCounters], end: Mapping[str, NodeCounters]
) -> tuple[int, int]:
    ok = failed = 0
    for node in nodes:
        if node in end:
            d_ok, d_failed = _delta(start.get(node), end[node])
            ok += d_ok
            failed += d_failed
    return ok, failed


def _p95(nodes: Iterable[str], figures: Mapping[str, NodeCounters]) -> float | None:
    values = [figures[n].ttft_p95_ms for n in nodes if n in figures]
    known = [v for v in values if v is not None]
    return max(known) if known else None


def evaluate(
    gates: GateSettings,
    *,
    new_nodes: Iterable[str],
    old_nodes: Iterable[str],
    start: Mapping[str, NodeCounters],
    end: Mapping[str, NodeCounters],
    baseline: Mapping[str, NodeCounters],
) -> GateResult:
    """Judge a bake window: ``start``/``end`` are counters at its edges; ``baseline``
    holds every plan node's counters from before the rollout (the old version)."""
    new_nodes, old_nodes = list(new_nodes), list(old_nodes)
    ok, failed = _totals(new_nodes, start, end)
    total = ok + failed
    figures: dict[str, float | int | str | None] = {"new_requests": total}
    if total < gates.min_requests:
        return GateResult(
            "inconclusive",
            [
                f"only {total} requests on the new version during the bake "
                f"(need {gates.min_requests})"
            ],
            figures,
        )
    # With min_requests 0 an empty bake is accepted: nothing failed on the new version.
    new_rate = failed / total if total else 0.0

    old_ok, old_failed = _totals(old_nodes, start, end)
    if old_ok + old_failed >= max(gates.min_requests, 1):
        old_rate, old_source = old_failed / (old_ok + old_failed), "same window"
        old_p95 = _p95(old_nodes, end)
    else:
        b_ok = sum(c.ok for c in baseline.values())
        b_failed = sum(c.failed for c in baseline.values())
        old_rate = b_failed / (b_ok + b_failed) if b_ok + b_failed else 0.0
        old_source = "before the rollout"
        old_p95 = _p95(baseline.keys(), baseline)
    new_p95 = _p95(new_nodes, end)
    own_before = _p95(new_nodes, baseline)
    reference = max((p for p in (old_p95, own_before) if p is not None), default=None)
    figures |= {
        "new_error_rate": round(new_rate, 6),
        "old_error_rate": round(old_rate, 6),
        "old_source": old_source,
        "new_ttft_p95_ms": new_p95,
        "old_ttft_p95_ms": old_p95,
        "new_nodes_ttft_p95_before_ms": own_before,
    }
    return judge(gates, new_rate, old_rate, new_p95, reference, figures)


def judge(
    gates: GateSettings,
    new_rate: float,
    old_rate: float,
    new_p95: float | None,
    old_p95: float | None,
    figures: dict[str, float | int | str | None],
) -> GateResult:
    reasons = []
    if new_rate > gates.max_error_rate:
        reasons.append(f"error rate {new_rate:.2%} above the ceiling {gates.max_error_rate:.2%}")
    elif new_rate > old_rate + gates.max_error_rate_increase:
        reasons.append(
            f"error rate {new_rate:.2%} vs {old_rate:.2%} on the replaced version "
            f"(allowed +{gates.max_error_rate_increase:.2%})"
        )
    if new_p95 is not None and old_p95 is not None:
        bound = old_p95 * gates.max_ttft_p95_ratio + gates.ttft_slack_ms
        if new_p95 > bound:
            reasons.append(f"TTFT P95 {new_p95:.0f} ms vs {old_p95:.0f} ms (bound {bound:.0f} ms)")
    if reasons:
        return GateResult("fail", reasons, figures)
    passed = [f"error rate {new_rate:.2%} (old {old_rate:.2%})"]
    if new_p95 is not None and old_p95 is not None:
        passed.append(f"TTFT P95 {new_p95:.0f} ms (old {old_p95:.0f} ms)")
    return GateResult("pass", passed, figures)


def acceptance(
    gates: GateSettings, result: GateResult, new: FeedbackCounts, old: FeedbackCounts
) -> GateResult:
    """``result`` with users' answer acceptance judged too (when both versions have
    ``min_feedback`` ratings): a drop beyond ``max_acceptance_drop`` fails it."""
    figures = result.figures | {
        "new_feedback": new.rated,
        "old_feedback": old.rated,
    }
    if new.rated < gates.min_feedback or old.rated < gates.min_feedback:
        return GateResult(result.verdict, result.reasons, figures)
    new_rate, old_rate = new.accepted / new.rated, old.accepted / old.rated
    figures |= {"new_acceptance": round(new_rate, 4), "old_acceptance": round(old_rate, 4)}
    if new_rate < old_rate - gates.max_acceptance_drop:
        reason = (
            f"answer acceptance {new_rate:.1%} vs {old_rate:.1%} on the replaced version "
            f"(allowed -{gates.max_acceptance_drop:.1%})"
        )
        failed = result.reasons if result.verdict == "fail" else []
        return GateResult("fail", [*failed, reason], figures)
    passed = f"answer acceptance {new_rate:.1%} (old {old_rate:.1%})"
    return GateResult(result.verdict, [*result.reasons, passed], figures)


@dataclass
class PrometheusGate:
    """Gate figures from a Prometheus server instead of the registry.

    Queries are PromQL templates with ``$model``, ``$version`` and ``$window``
    (the bake length, e.g. ``90s``) placeholders, each returning one scalar
    (``string.Template`` syntax, since PromQL itself uses braces).
    """

    url: str
    error_rate_query: str
    ttft_p95_query: str
    client: httpx.AsyncClient

    async def figures(
        self, model: str, version: str, window_s: float
    ) -> tuple[float | None, float | None]:
        values = []
        for template in (self.error_rate_query, self.ttft_p95_query):
            query = Template(template).safe_substitute(
                model=model, version=version, window=f"{max(1, int(window_s))}s"
            )
            values.append(await self._scalar(query))
        return values[0], values[1]

    async def _scalar(self, query: str) -> float | None:
        try:
            resp = await self.client.get(f"{self.url}/api/v1/query", params={"query": query})
            resp.raise_for_status()
            result = resp.json()["data"]["result"]
        except (httpx.HTTPError, KeyError, ValueError) as exc:
            raise GateUnavailable(f"prometheus query {query!r} failed: {exc}") from None
        if not result:
            return None
        value = float(result[0]["value"][1])
        return None if value != value else value  # NaN: no samples in the window


class GateUnavailable(Exception):
    """The configured metrics source could not answer; the gate is inconclusive."""
