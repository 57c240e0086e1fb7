"""The routing decision for one request: tier, version, and candidates in try order.

Requests that name ``auto`` (or an alias mapped to ``None``) are classified:
simple ones go to the edge unless the center predicts a lower TTFT even after
its cost bias (a spill), hard ones go to the center (edges only as a last
resort). A tier alias pins the tier, a concrete model name pins the model.
A canary split picks one version per model, sticky per user, and prefers
instances running it when any exist.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from geo_router.catalog import CandidateSource, TrafficSource
from geo_router.classifier import Classification, DifficultyClassifier
from geo_router.region import ResolvedRegion
from geo_router.scoring import Scored, Scorer
from geo_router.settings import RoutingSettings
from geo_router.tracker import Tracker
from servekit.errors import ModelNotFound, NotReady
from servekit.registry.protocol import InstanceState, Tier

__all__ = ["Decision", "Planner", "canary_version", "ensure_center", "estimate_prompt_tokens"]


@dataclass(slots=True)
class Decision:
    region: ResolvedRegion
    classification: Classification | None
    tier: Tier | None  # the preferred tier (None: a pinned model, any tier)
    model: str | None  # the pinned model, if the request named one
    versions: dict[str, str] = field(default_factory=dict)  # canary pick per model
    candidates: list[Scored] = field(default_factory=list)

    def reason(self, chosen: Scored) -> str:
        if self.model is not None:
            return "model"
        if self.classification is None:
            return "pinned-tier"
        if self.classification.difficulty == "hard":
            return "hard" if chosen.tier == "center" else "hard-no-center"
        if chosen.tier == "center":
            has_edge = any(c.tier == "edge" for c in self.candidates)
            return "spill-center" if has_edge else "no-edge"
        return "simple" if chosen.region == self.region.region else "spill-region"

    def to_dict(self) -> dict[str, Any]:
        chosen = self.candidates[0] if self.candidates else None
        return {
            "region": self.region.region,
            "region_source": self.region.source,
            "client_ip": self.region.client_ip,
            "difficulty": self.classification.difficulty if self.classification else None,
            "score": round(self.classification.score, 4) if self.classification else None,
            "tier": chosen.tier if chosen else self.tier,
            "model": self.model,
            "versions": self.versions,
            "reason": self.reason(chosen) if chosen else "no-candidate",
            "instance": chosen.id if chosen else None,
            "candidates": [c.to_dict() for c in self.candidates],
        }


def estimate_prompt_tokens(body: Mapping[str, Any]) -> int:
    """Rough prompt size: ~3.5 characters a token across English and Chinese."""
    chars = 0
    messages = body.get("messages")
    if isinstance(messages, list):
        for m in messages:
            content = m.get("content") if isinstance(m, dict) else None
            if isinstance(content, str):
                chars += len(content)
            elif isinstance(content, list):
                chars += sum(len(str(p.get("text", ""))) for p in content if isinstance(p, dict))
    prompt = body.get("prompt")
    if isinstance(prompt, str):
        chars += len(prompt)
    elif isinstance(prompt, list):
        chars += sum(len(p) for p in prompt if isinstance(p, str))
    return max(1, int(chars / 3.5))


def canary_version(shares: Mapping[str, float], sticky_key: str) -> str | None:
    """The version ``sticky_key`` lands on; the same key always lands on the same one."""
    total = sum(v for v in shares.values() if v > 0)
    if total <= 0:
        return None
    digest = hashlib.blake2b(sticky_key.encode("utf-8"), digest_size=8).digest()
    point = int.from_bytes(digest, "big") / 2**64 * total
    acc = 0.0
    for version in sorted(shares):
        acc += max(0.0, shares[version])
        if point < acc:
            return version
    return sorted(shares)[-1]


class Planner:
    def __init__(
        self,
        routing: RoutingSettings,
        classifier: DifficultyClassifier,
        scorer: Scorer,
        tracker: Tracker,
        candidates: CandidateSource,
        traffic: TrafficSource,
    ) -> None:
        self._routing = routing
        self._classifier = classifier
        self._scorer = scorer
        self._tracker = tracker
        self._candidates = candidates
        self._traffic = traffic

    def healthy(self) -> list[InstanceState]:
        return [s for s in self._candidates() if _serving(s)]

    def models(self) -> list[str]:
        return sorted({s.info.model for s in self.healthy() if s.info.model})

    def plan(
        self,
        body: Mapping[str, Any],
        region: ResolvedRegion,
        sticky_key: str,
        exclude: Sequence[str] = (),
    ) -> Decision:
        name = str(body.get("model", ""))
        aliases = self._routing.aliases
        listed = self._candidates()
        available = self._tracker.available
        pool = [
            s for s in listed if _serving(s) and s.info.id not in exclude and available(s.info.id)
        ]
        if name in aliases:
            tier = aliases[name]
            cls = self._classifier.classify(body) if tier is None else None
            decision = Decision(region, cls, tier, None)
            if cls is not None:
                tier = "center" if cls.difficulty == "hard" else "edge"
                decision.tier = tier
        else:
            if not any(s.info.model == name for s in listed):
                raise ModelNotFound(f"model {name!r} does not exist", param="model")
            decision = Decision(region, None, None, name)
            pool = [s for s in pool if s.info.model == name]
        pool = self._canary(pool, sticky_key, decision)
        decision.candidates = self._rank(pool, decision, estimate_prompt_tokens(body))
        if not decision.candidates and not exclude:
            raise NotReady("no healthy upstream can serve this request", retry_after=1)
        return decision

    def _canary(
        self, pool: list[InstanceState], sticky_key: str, decision: Decision
    ) -> list[InstanceState]:
        for model in sorted({s.info.model for s in pool}):
            shares = self._traffic(model)
            if not shares:
                continue
            version = canary_version(shares, f"{model}:{sticky_key}")
            if version is None:
                continue
            decision.versions[model] = version
            if any(s.info.model == model and s.info.version == version for s in pool):
                pool = [s for s in pool if s.info.model != model or s.info.version == version]
        return pool

    def _rank(self, pool: list[InstanceState], decision: Decision, tokens: int) -> list[Scored]:
        region = decision.region.region
        if decision.model is not None:
            return self._scorer.order([self._scorer.score(s, region, tokens) for s in pool])
        if decision.classification is None:  # pinned tier
            tiered = [s for s in pool if s.info.tier == decision.tier]
            return self._scorer.order([self._scorer.score(s, region, tokens) for s in tiered])
        if decision.tier == "edge":
            bias = self._routing.center_bias_ms
            scored = [
                self._scorer.score(s, region, tokens, bias if s.info.tier == "center" else 0.0)
                for s in pool
            ]
            ordered = self._scorer.order(scored)
            return ensure_center(ordered, self._routing.max_attempts)
        centers = [self._scorer.score(s, region, tokens) for s in pool if s.info.tier == "center"]
        ordered = self._scorer.order(centers)
        if self._routing.hard_may_use_edge:
            edges = [self._scorer.score(s, region, tokens) for s in pool if s.info.tier == "edge"]
            ordered += sorted(edges, key=lambda s: s.predicted_ms)
        return ordered


def ensure_center(ordered: list[Scored], attempts: int) -> list[Scored]:
    """Failover ends at the center: make sure one is among the first ``attempts``."""
    if attempts < 2 or any(s.tier == "center" for s in ordered[:attempts]):
        return ordered
    center = next((s for s in ordered if s.tier == "center"), None)
    if center is None:
        return ordered
    rest = [s for s in ordered if s is not center]
    return [*rest[: attempts - 1], center, *rest[attempts - 1 :]]


def _serving(state: InstanceState) -> bool:
    """Healthy and not draining: may be offered new requests."""
    return state.healthy and not state.load.draining
