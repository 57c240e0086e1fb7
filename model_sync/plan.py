"""Turn ``model-sync rollout NAME VERSION --canary ... --waves ...`` into a plan.

Nodes are the healthy edge instances in the catalog that serve the model.
The canary wave comes first (a count, a percentage of the fleet, or named
nodes); the remaining nodes follow in one wave per region, in the order the
operator gave (regions not named follow, sorted), or all at once.
"""

from __future__ import annotations

import math
import uuid
from collections import Counter
from collections.abc import Sequence

from model_sync.records import GateSettings, RolloutPlan, Wave
from model_sync.store import ConflictError, SyncStore
from servekit.durations import parse_duration
from servekit.registry.protocol import Catalog, InstanceState

__all__ = ["PlanError", "build_plan", "parse_duration"]


class PlanError(ConflictError):
    """The rollout cannot be planned as asked."""


def _canary_nodes(spec: str, ordered: Sequence[InstanceState]) -> list[str]:
    ids = [s.info.id for s in ordered]
    spec = spec.strip()
    if spec.endswith("%"):
        try:
            pct = float(spec[:-1])
        except ValueError:
            raise PlanError(f"invalid canary percentage {spec!r}") from None
        if not 0 < pct <= 100:
            raise PlanError(f"canary percentage must be in (0, 100], got {spec}")
        return ids[: max(1, math.ceil(len(ids) * pct / 100))]
    if spec.isdigit():
        if int(spec) < 1:
            raise PlanError("canary count must be at least 1")
        return ids[: int(spec)]
    named = [n.strip() for n in spec.split(",") if n.strip()]
    unknown = [n for n in named if n not in ids]
    if unknown:
        raise PlanError(f"canary nodes not serving this model: {', '.join(unknown)}")
    return named


def _region_order(spec: str | None, nodes: Sequence[InstanceState]) -> list[str] | None:
    regions = sorted({s.info.region for s in nodes})
    if spec is None or spec in ("", "all"):
        return None
    if spec == "by-region":
        return regions
    asked = [r.strip() for r in spec.split(",") if r.strip()]
    unknown = [r for r in asked if r not in regions]
    if unknown:
        raise PlanError(
            f"no nodes of this model in region(s) {', '.join(unknown)}; known: {', '.join(regions)}"
        )
    return asked + [r for r in regions if r not in asked]


async def build_plan(
    catalog: Catalog,
    store: SyncStore,
    model: str,
    version: str,
    *,
    canary: str | None = None,
    waves: str | None = None,
    bake_s: float = 60.0,
    gates: GateSettings | None = None,
    converge_timeout_s: float = 600.0,
) -> RolloutPlan:
    """A plan over the model's healthy edge nodes; raises :class:`PlanError` if impossible."""
    if await store.artifact(model, version) is None:
        raise PlanError(f"{model} {version} is not registered; push it first")
    nodes = [s for s in await catalog.instances(tier="edge") if s.info.model == model]
    if not nodes:
        raise PlanError(f"no healthy edge nodes serve {model}")
    order = _region_order(waves, nodes)
    rank = {r: i for i, r in enumerate(order or [])}
    nodes.sort(key=lambda s: (rank.get(s.info.region, 0), s.info.region, s.info.id))

    previous: dict[str, str] = {}
    for s in nodes:
        actual = await store.actual(s.info.id)
        previous[s.info.id] = (actual.version if actual and actual.version else "") or (
            s.info.version
        )
    stable = await store.alias(model, "stable")
    common = Counter(v for v in previous.values() if v and v != version).most_common(1)
    from_version = stable if stable and stable != version else (common[0][0] if common else "")

    plan_waves: list[Wave] = []
    remaining = [s for s in nodes]
    if canary:
        picked = _canary_nodes(canary, nodes)
        plan_waves.append(Wave(name="canary", nodes=picked, bake_s=bake_s))
        remaining = [s for s in remaining if s.info.id not in picked]
    if order is None:
        if remaining:
            plan_waves.append(Wave(name="all", nodes=[s.info.id for s in remaining], bake_s=bake_s))
    else:
        for region in order:
            ids = [s.info.id for s in remaining if s.info.region == region]
            if ids:
                plan_waves.append(Wave(name=f"region {region}", nodes=ids, bake_s=bake_s))
    return RolloutPlan(
        id=uuid.uuid4().hex[:12],
        model=model,
        version=version,
        from_version=from_version,
        waves=plan_waves,
        previous=previous,
        gates=gates or GateSettings(),
        converge_timeout_s=converge_timeout_s,
        created_by=store.actor,
    )
