"""What the router's spans say: the attributes of its intake stages and attempts.

The spans themselves are made where their work happens: the request span by
``geo_router.completions``, an attempt's by its
:class:`~geo_router.attempt.Attempt`, a continuation's by
``geo_router.routed``. Only ids, names, counts and times go into them:
never the prompt, the answer or a key.

``router.request`` (server span, the client's ``traceparent`` continued)
├── ``router.auth``, ``router.body``, ``router.limit``, ``router.region``,
│   ``router.classify``, ``router.plan``: the intake stages (``geo_router.stages``)
├── ``router.attempt``: one per try (failover, hedge), its ``traceparent``
│   sent upstream, so the edge's or center's ``serve.request`` is its child
└── ``router.continuation``: a mid-stream continuation's re-plan and dispatch
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from geo_router.planner import Decision
from geo_router.scoring import Scored
from geo_router.stages import Stages
from servekit.tracing import Tracing

if TYPE_CHECKING:
    from opentelemetry.trace import Span
    from opentelemetry.util.types import AttributeValue

__all__ = ["candidate_attributes", "trace_intake"]


def candidate_attributes(cand: Scored) -> dict[str, AttributeValue]:
    """Where an attempt goes and what the planner expected of it."""
    info = cand.state.info
    return {
        "route.instance": cand.id,
        "route.tier": cand.tier,
        "route.region": cand.region,
        "route.model": info.model,
        "route.model_version": info.version or "",
        "route.predicted_ttft_ms": round(cand.predicted_ms, 3),
        "route.rtt_ms": round(cand.rtt_ms, 3),
        "route.queue_ms": round(cand.queue_ms, 3),
        "route.prefill_ms": round(cand.prefill_ms, 3),
        "route.prompt_tokens": cand.prompt_tokens,
        "route.cached_tokens": cand.cached_tokens,
    }


def _stage_attributes(
    decision: Decision, tenant: str | None
) -> dict[str, dict[str, AttributeValue]]:
    region = decision.region
    plan: dict[str, AttributeValue] = {
        "route.candidates": len(decision.candidates),
        "route.prompt_tokens": decision.prompt_tokens,
        "route.fits_a_window": decision.fits,
    }
    if decision.candidates:
        chosen = decision.candidates[0]
        plan.update(candidate_attributes(chosen))
        plan["route.reason"] = decision.reason(chosen)
    attrs: dict[str, dict[str, AttributeValue]] = {
        "auth": {"route.tenant": tenant or "-"},
        "region": {"route.user_region": region.region, "route.region_source": region.source},
        "plan": plan,
    }
    cls = decision.classification
    if cls is not None:
        attrs["classify"] = {
            "route.task": cls.task,
            "route.task_score": round(cls.task_score, 4),
            "route.difficulty": cls.difficulty,
            "route.score": round(cls.score, 4),
            "route.policy_rule": cls.rule,
        }
    return attrs


def trace_intake(
    tracing: Tracing, span: Span, stages: Stages, decision: Decision, tenant: str | None
) -> None:
    """The intake stages as children of the request's span, at the times they ran."""
    attrs = _stage_attributes(decision, tenant)
    for name, began, ended in stages.spans():
        tracing.record(f"router.{name}", span, began, ended, attrs.get(name))
