"""Which tier a task type goes to: the policy table and the quality/cost dial.

The classifier (:mod:`geo_router.tasks`) gives each task type a probability.
Each task type has a *quality gap*: how much worse a 7B-class model answers it
than a large one, scaled to 0..1 (defaults in :data:`DEFAULT_GAPS`, taken
from MT-Bench's published per-category scores; ``docs/router.md`` cites
them). A request's score is its expected gap, ``sum(p(task) * gap(task))``.
The tier is, first match wins:

1. ``tenants[tenant][task]``: a tenant's own table (by the most likely task);
2. ``use_cases[X-Use-Case]``: a use case's tier (real-time customer service
   on the edge, long reports on the center);
3. ``tiers[task]``: the operator's table for the most likely task;
4. the dial: ``center`` when the score is at least ``threshold`` (lower it to
   buy back more of the gap with more center traffic; ``geo-router
   eval-classifier`` prints the curve).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from pydantic import Field, field_validator

from geo_router.tasks import TASKS
from servekit.config import Section
from servekit.registry.protocol import Tier

__all__ = ["DEFAULT_GAPS", "Policy", "PolicySettings", "Route"]

# Gap in MT-Bench score (GPT-4 minus Vicuna-13B, the published radar chart of
# Zheng et al. 2023), divided by the largest (coding, 5.3). Task types with no
# MT-Bench category are estimated from the nearest one (see docs/router.md).
DEFAULT_GAPS: dict[str, float] = {
    "chat": 0.05,
    "lookup": 0.15,
    "extraction": 0.70,
    "translation": 0.30,
    "summarization": 0.30,
    "writing": 0.08,
    "roleplay": 0.32,
    "explanation": 0.23,
    "math": 0.79,
    "reasoning": 0.58,
    "code": 1.00,
    "code_review": 0.60,
}


class PolicySettings(Section):
    """Task type (and tenant, ``X-Use-Case``) to tier; see :mod:`geo_router.policy`."""

    gaps: dict[str, float] = Field(
        default_factory=lambda: dict(DEFAULT_GAPS),
        description="Quality gap per task type, 0..1 (small model vs large).",
    )
    tiers: dict[str, Tier] = Field(
        default_factory=dict, description="Task type pinned to a tier (before the dial)."
    )
    use_cases: dict[str, Tier] = Field(
        default_factory=dict, description="X-Use-Case header value pinned to a tier."
    )
    tenants: dict[str, dict[str, Tier]] = Field(
        default_factory=dict, description="Per tenant: task type pinned to a tier."
    )

    @field_validator("gaps")
    @classmethod
    def _gaps_known(cls, gaps: dict[str, float]) -> dict[str, float]:
        unknown = sorted(set(gaps) - set(TASKS))
        if unknown:
            raise ValueError(f"unknown task types {unknown}; known: {list(TASKS)}")
        if any(not 0.0 <= g <= 1.0 for g in gaps.values()):
            raise ValueError("gaps must lie in 0..1")
        return {**DEFAULT_GAPS, **gaps}


@dataclass(frozen=True, slots=True)
class Route:
    tier: Tier
    task: str  # the most likely task type
    task_score: float  # its probability
    score: float  # expected quality gap, 0..1
    rule: str  # tenant | use-case | table | dial


class Policy:
    def __init__(self, settings: PolicySettings, threshold: float) -> None:
        self.settings = settings
        self.threshold = threshold

    def score(self, probabilities: Mapping[str, float]) -> float:
        gaps = self.settings.gaps
        return sum(p * gaps.get(t, 0.0) for t, p in probabilities.items())

    def route(
        self,
        probabilities: Mapping[str, float],
        tenant: str | None = None,
        use_case: str | None = None,
    ) -> Route:
        task = max(probabilities, key=probabilities.__getitem__)
        p, score = probabilities[task], self.score(probabilities)
        s = self.settings
        pinned = s.tenants.get(tenant, {}).get(task) if tenant is not None else None
        if pinned is not None:
            return Route(pinned, task, p, score, "tenant")
        if use_case is not None and use_case in s.use_cases:
            return Route(s.use_cases[use_case], task, p, score, "use-case")
        if task in s.tiers:
            return Route(s.tiers[task], task, p, score, "table")
        return Route("center" if score >= self.threshold else "edge", task, p, score, "dial")
