"""The routing decision for one request: tier, version, and candidates in try order.

Requests that name ``auto`` (or an alias mapped to ``None``) are classified:
simple ones go to the edge unless the center predicts a lower TTFT even after
its cost bias (a spill), hard ones go to the center (edges only as a last
resort). A tier alias pins the tier, a concrete model name pins the model.
A canary split picks one version per model, sticky per user, and prefers
instances running it when any exist (instances of versions outside the split,
such as a center serving the same model name, are not filtered).

Context windows (``geo_router.trimming.fit_pool``): an instance that reports
``max_context_tokens`` is offered only requests whose estimated prompt plus
``max_tokens`` fit it; a tier whose trimming policy is on (``routing.trimming``,
per tier and tenant) gets long conversations trimmed to fit instead. When no
instance can hold a request, those with the largest window are tried, and their
own ``context_length_exceeded`` reaches the client. A pinned tier is fitted
among its own instances only, so one too small for the request answers 400.

A prefix cached only away from the user (its first request happened to land
on a neighbour) would keep its traffic there: the instance holding it is
cheaper than a cold start at the same-city edge, every time. Moving it home
is priced as rent against a purchase (the ski-rental rule): while the best
candidate of a simple request is not a same-city edge that would be better
once it held the prefix, each request served away pays *rent*, what that
edge would have saved it; once the rent paid for the prefix (named by its
opening, ``Prefix.anchor``: a shared system prompt collects it from every
conversation that starts with it, a one-off conversation only from its own
turns) reaches the *purchase*, the cold prefill there less the best
candidate's time now, the edge goes first (``warming``), pays the cold
prefill once and holds the prefix from then on. Never paying more than
twice what the best choice in hindsight would have paid, it moves a
customer-service system prompt home after a few conversations on a GPU and
after many on a CPU edge (where a cold prefill costs seconds), and leaves a
one-off conversation where its history is cached.
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from geo_router.catalog import CandidateSource, TrafficSource
from geo_router.classifier import Classification, TaskClassifier
from geo_router.conversation import (
    Turn,
    estimate_prompt_tokens,
    output_budget,
    turns_of,
)
from geo_router.prefix_index import EMPTY, Prefix, PrefixIndex
from geo_router.region import ResolvedRegion
from geo_router.routing_settings import RoutingSettings
from geo_router.scoring import Scored, Scorer, within_budget_first
from geo_router.tracker import Tracker
from geo_router.trimming import Trim, fit_pool
from servekit.errors import ModelNotFound, NotReady
from servekit.registry.protocol import InstanceState, Tier

__all__ = [
    "Decision",
    "Planner",
    "RequestShape",
    "canary_version",
    "ensure_center",
    "rank_classified",
    "tier_bias_ms",
]


@dataclass(frozen=True, slots=True)
class RequestShape:
    """What placement needs to know of a request: its size, output budget and prefix."""

    turns: list[Turn]
    messages: list[Any] | None  # the client's chat messages, for trimming
    tokens: int
    max_tokens: int | None
    prefix: Prefix
    cache_salt: str | None = None  # its cache scope (a trimmed prefix is named in it too)

    @property
    def out_tokens(self) -> int:
        """What the window must leave for the answer (1 when the client set no limit:
        engines trim an unbounded answer to what is left)."""
        return self.max_tokens or 1


@dataclass(slots=True)
class Decision:
    region: ResolvedRegion
    classification: Classification | None
    tier: Tier | None  # the preferred tier (None: a pinned model, any tier)
    model: str | None  # the pinned model, if the request named one
    versions: dict[str, str] = field(default_factory=dict)  # canary pick per model
    candidates: list[Scored] = field(default_factory=list)
    prompt_tokens: int = 0
    fits: bool = True  # some instance's window can hold it
    classified_at: float | None = None  # perf_counter when classification ended (Server-Timing)

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
            "task": self.classification.task if self.classification else None,
            "task_score": round(self.classification.task_score, 4) if self.classification else None,
            "policy_rule": self.classification.rule if self.classification else None,
            "tier": chosen.tier if chosen else self.tier,
            "model": self.model,
            "versions": self.versions,
            "reason": self.reason(chosen) if chosen else "no-candidate",
            "instance": chosen.id if chosen else None,
            "prompt_tokens": self.prompt_tokens,
            "fits_a_window": self.fits,
            "candidates": [c.to_dict() for c in self.candidates],
        }


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
        classifier: TaskClassifier,
        scorer: Scorer,
        tracker: Tracker,
        candidates: CandidateSource,
        traffic: TrafficSource,
        prefixes: PrefixIndex | None = None,
        known_model: Callable[[str], bool] = lambda _model: False,
    ) -> None:
        self._known_model = known_model  # listed lately, though not now
        self._routing = routing
        self._classifier = classifier
        self._scorer = scorer
        self._tracker = tracker
        self._candidates = candidates
        self._traffic = traffic
        self.prefixes = prefixes

    def shape(self, body: Mapping[str, Any], cache_salt: str | None = None) -> RequestShape:
        turns = turns_of(body)
        tokens = estimate_prompt_tokens(body, turns)
        messages = body.get("messages")
        prefix = (
            EMPTY
            if self.prefixes is None
            else self.prefixes.prefix(turns, tokens, cache_salt=cache_salt)
        )
        return RequestShape(
            turns,
            messages if isinstance(messages, list) else None,
            tokens,
            output_budget(body),
            prefix,
            cache_salt,
        )

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
        *,
        tenant: str | None = None,
        use_case: str | None = None,
        cache_salt: str | None = None,
    ) -> Decision:
        """Candidates for ``body``, best first; ``cache_salt`` is the tenant's cache
        scope (prefixes another scope left on an instance earn no credit)."""
        name = str(body.get("model", ""))
        aliases = self._routing.aliases
        listed = self._candidates()
        available = self._tracker.available
        pool = [
            s for s in listed if _serving(s) and s.info.id not in exclude and available(s.info.id)
        ]
        if name in aliases:
            tier = aliases[name]
            cls = None
            classified_at = None
            if tier is None:
                cls = self._classifier.classify(body, tenant=tenant, use_case=use_case)
                classified_at = time.perf_counter()
            decision = Decision(region, cls, tier, None, classified_at=classified_at)
            if cls is not None:
                tier = "center" if cls.difficulty == "hard" else "edge"
                decision.tier = tier
        else:
            if not any(s.info.model == name for s in listed):
                if self._known_model(name):  # its instances are draining or restarting
                    raise NotReady(f"no instance of {name!r} is serving now", retry_after=1)
                raise ModelNotFound(f"model {name!r} does not exist", param="model")
            decision = Decision(region, None, None, name)
            pool = [s for s in pool if s.info.model == name]
        pool = self._canary(pool, sticky_key, decision)
        shape = self.shape(body, cache_salt)
        decision.prompt_tokens = shape.tokens
        decision.candidates = self._rank(pool, decision, shape, tenant)
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
                # Only the versions being split are filtered: an instance serving the
                # model under another version (a center's own build) stays a candidate.
                pool = [
                    s
                    for s in pool
                    if s.info.model != model
                    or s.info.version == version
                    or s.info.version not in shares
                ]
        return pool

    def _fitted(
        self, pool: list[InstanceState], shape: RequestShape, decision: Decision, tenant: str | None
    ) -> list[tuple[InstanceState, int, Trim | None]]:
        trimming = self._routing.trimming
        found = fit_pool(
            pool,
            shape.tokens,
            shape.out_tokens,
            shape.messages,
            lambda tier: trimming.policy(tier, tenant),
        )
        decision.fits = found.fits
        return found.fitted

    def _score(
        self,
        state: InstanceState,
        region: str,
        tokens: int,
        trim: Trim | None,
        shape: RequestShape,
        bias_ms: float = 0.0,
    ) -> Scored:
        prefix, cached, source = shape.prefix, 0, "none"
        if self.prefixes is not None:
            if trim is not None:
                turns = turns_of({"messages": trim.messages})
                prefix = self.prefixes.prefix(turns, tokens, cache_salt=shape.cache_salt)
            age = self._tracker.report_age_s(state)
            found = self.prefixes.cached_blocks(state.info.id, prefix, state.load, report_age_s=age)
            cached, source = prefix.tokens(found.blocks), found.source
        return self._scorer.score(
            state,
            region,
            tokens,
            bias_ms,
            cached_tokens=cached,
            cached_source=source,
            trim=trim,
            prefix=prefix,
        )

    def _rank(
        self,
        pool: list[InstanceState],
        decision: Decision,
        shape: RequestShape,
        tenant: str | None = None,
    ) -> list[Scored]:
        region = decision.region.region
        order = self._scorer.order
        if decision.model is None and decision.classification is None:  # pinned tier
            pool = [s for s in pool if s.info.tier == decision.tier]
        fitted = self._fitted(pool, shape, decision, tenant)
        if decision.model is not None or decision.classification is None:
            return within_budget_first(
                order([self._score(s, region, n, t, shape) for s, n, t in fitted])
            )
        preferred: Tier = "edge" if decision.tier == "edge" else "center"
        scored = [
            self._score(s, region, n, t, shape, tier_bias_ms(self._routing, preferred, s.info.tier))
            for s, n, t in fitted
        ]
        rent = self.prefixes.rent_paid if self.prefixes is not None else _no_rent
        return rank_classified(scored, preferred, region, self._routing, order, rent)


def _no_rent(_anchor: int) -> float:
    return 0.0


def tier_bias_ms(routing: RoutingSettings, preferred: Tier, tier: Tier) -> float:
    """The bias added to a candidate's predicted TTFT: the center's cost bias
    when a simple request (preferred tier ``edge``) considers the center."""
    return routing.center_bias_ms if preferred == "edge" and tier == "center" else 0.0


def rank_classified(
    scored: list[Scored],
    preferred: Tier,
    region: str,
    routing: RoutingSettings,
    order: Callable[[list[Scored]], list[Scored]],
    rent_paid: Callable[[int], float] = lambda _anchor: 0.0,
) -> list[Scored]:
    """Try order for a classified request from its scored candidates (scored with
    :func:`tier_bias_ms`): simple ones (``preferred="edge"``) rank edges and the
    center together, a same-city edge warming a prefix cached elsewhere first once
    the rent paid for it (``rent_paid``, by the prefix's anchor) covers the move, a
    center among the first ``max_attempts``; hard ones (``"center"``) rank the
    centers, then the edges in the scorer's order when ``hard_may_use_edge``. Pure: the
    router's planner and the fleet simulator both rank with it; ``order`` is the
    scorer's (power-of-two choices)."""
    if preferred == "edge":
        ordered = _warm_local(within_budget_first(order(scored)), region, rent_paid)
        return ensure_center(ordered, routing.max_attempts)
    ordered = order([c for c in scored if c.tier == "center"])
    if routing.hard_may_use_edge:
        ordered += order([c for c in scored if c.tier == "edge"])
    return within_budget_first(ordered)


def _warm_local(
    ordered: list[Scored], region: str, rent_paid: Callable[[int], float]
) -> list[Scored]:
    """A same-city edge first once moving the prefix cached elsewhere has paid for
    itself; else the best candidate, carrying the rent it pays (see the module docstring)."""
    if not ordered or (ordered[0].tier == "edge" and ordered[0].region == region):
        return ordered
    held = max(c.cached_tokens for c in ordered)
    if held <= 0:
        return ordered

    def warm_ms(c: Scored) -> float:
        uncached = c.prompt_tokens - c.cached_tokens
        per_token = c.prefill_ms / uncached if uncached > 0 else 0.0
        return c.predicted_ms - c.prefill_ms + per_token * max(0, c.prompt_tokens - held)

    local = [
        c
        for c in ordered
        if c.tier == "edge" and c.region == region and not c.over_budget and c.trim is None
    ]
    if not local:
        return ordered
    best = min(local, key=warm_ms)
    first = ordered[0]
    rent = first.predicted_ms - warm_ms(best)  # what serving it away costs this request
    if rent <= 0:
        return ordered
    anchor = first.prefix.anchor if first.prefix is not None else 0
    purchase = best.predicted_ms - first.predicted_ms  # the cold start there, beyond now
    if rent_paid(anchor) + rent < purchase:
        return [replace(first, rent_ms=rent), *ordered[1:]]
    return [replace(best, warming=True), *(c for c in ordered if c is not best)]


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
