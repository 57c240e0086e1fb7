"""The routing classification of a request: its task type, then its tier.

:class:`TaskClassifier` reads the latest user turn in its conversation
(:mod:`geo_router.reading`), gives each task type a probability
(:mod:`geo_router.tasks`) and lets the policy (:mod:`geo_router.policy`)
pick the tier. ``difficulty`` stays the word the rest of the router and
``geo-router classify`` use: ``hard`` is a request the policy sends to the
center, and ``score`` is its expected quality gap (what the dial compares
with its threshold).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from geo_router.policy import Policy, PolicySettings
from geo_router.reading import read
from geo_router.tasks import TaskModel

__all__ = ["Classification", "Difficulty", "TaskClassifier"]

Difficulty = Literal["simple", "hard"]


@dataclass(frozen=True, slots=True)
class Classification:
    difficulty: Difficulty
    score: float  # expected quality gap, 0..1
    task: str = "lookup"
    task_score: float = 0.0  # probability of ``task``
    rule: str = "dial"  # what decided the tier: tenant | use-case | table | dial

    def to_dict(self) -> dict[str, Any]:
        return {
            "difficulty": self.difficulty,
            "score": round(self.score, 4),
            "task": self.task,
            "task_score": round(self.task_score, 4),
            "rule": self.rule,
        }


class TaskClassifier:
    def __init__(self, model: TaskModel, policy: Policy) -> None:
        self.model = model
        self.policy = policy

    @classmethod
    def load(
        cls,
        weights: Path | None = None,
        threshold: float = 0.5,
        policy: PolicySettings | None = None,
    ) -> TaskClassifier:
        return cls(TaskModel.load(weights), Policy(policy or PolicySettings(), threshold))

    def classify(
        self,
        body: Mapping[str, Any],
        tenant: str | None = None,
        use_case: str | None = None,
    ) -> Classification:
        probabilities = self.model.probabilities_of(read(body))
        route = self.policy.route(probabilities, tenant, use_case)
        difficulty: Difficulty = "hard" if route.tier == "center" else "simple"
        return Classification(difficulty, route.score, route.task, route.task_score, route.rule)
