"""What ``model-sync status`` shows: every node's desired and actual version,
health and progress, joined from the catalog and the nodes' KV documents."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from model_sync.records import RolloutPlan, RolloutState
from model_sync.store import SyncStore
from servekit.registry.protocol import Catalog

__all__ = ["FleetStatus", "NodeStatus", "fleet_status"]


@dataclass
class NodeStatus:
    node: str
    region: str
    model: str
    desired: str | None
    version: str | None
    state: str
    progress: float | None
    error: str | None
    healthy: bool | None
    ttft_p95_ms: float | None
    requests_ok: int
    requests_failed: int

    @property
    def in_sync(self) -> bool:
        return self.desired is None or (self.desired == self.version and self.state == "serving")


@dataclass
class FleetStatus:
    nodes: list[NodeStatus]
    rollout: RolloutState | None
    plan: RolloutPlan | None
    shares: dict[str, float]

    def to_dict(self) -> dict[str, Any]:
        return {
            "nodes": [asdict(n) for n in self.nodes],
            "rollout": self.rollout.model_dump(exclude={"outbox"}) if self.rollout else None,
            "plan": self.plan.model_dump() if self.plan else None,
            "traffic": self.shares,
        }


async def fleet_status(catalog: Catalog, store: SyncStore, model: str | None) -> FleetStatus:
    instances = {s.info.id: s for s in await catalog.instances(tier="edge", healthy_only=False)}
    docs = await store.nodes()
    nodes = []
    for node in sorted(set(instances) | set(docs)):
        inst = instances.get(node)
        desired, actual = docs.get(node, (None, None))
        node_model = (
            (desired.model if desired else "")
            or (actual.model if actual else "")
            or (inst.info.model if inst else "")
        )
        if model and node_model != model:
            continue
        load = inst.load if inst else None
        nodes.append(
            NodeStatus(
                node=node,
                region=inst.info.region if inst else "?",
                model=node_model,
                desired=desired.version if desired else None,
                version=(actual.version if actual else None)
                or (inst.info.version if inst else None),
                state=actual.state if actual else ("serving" if inst else "unknown"),
                progress=actual.progress if actual and actual.state == "downloading" else None,
                error=actual.error if actual else None,
                healthy=inst.healthy if inst else None,
                ttft_p95_ms=load.ttft_p95_ms if load else (actual.ttft_p95_ms if actual else None),
                requests_ok=load.requests_ok if load else (actual.requests_ok if actual else 0),
                requests_failed=(
                    load.requests_failed if load else (actual.requests_failed if actual else 0)
                ),
            )
        )
    rollout = plan = None
    shares: dict[str, float] = {}
    if model:
        rollout, plan = await store.state(model), await store.plan(model)
        shares = (await store.traffic(model)).shares
    return FleetStatus(nodes, rollout, plan, shares)
