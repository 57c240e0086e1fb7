"""Consul's health listing (``/v1/health/service/<name>``) read as instances.

Each entry is a node's copy of a service with its checks. An instance is
*healthy* (alive) while its own TTL check ``service:<id>`` is ``passing``
(beating, ready) or ``warning`` (beating, not ready: loading, warming or
draining) and every other check of the entry (the node's ``serfHealth``,
maintenance mode) passes. Its load is the JSON its last heartbeat left in the
check's ``Output``, which a Consul agent forwards to the servers only after
``check_update_interval`` unless the status changed: a reader gets readiness
at once and figures late (routers poll ``/load`` for those).

The same instance ID on two nodes (an instance that beat through the wrong
agent, or moved hosts) is one instance here: the alive copy wins, then the
most recently updated one.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from servekit.registry.codec import info_from_meta, load_from_json, sent_at_from_json
from servekit.registry.protocol import InstanceState

__all__ = ["Listing", "check_id", "read_listing"]

_ALIVE = ("passing", "warning")


def check_id(instance_id: str) -> str:
    """The TTL check that carries an instance's heartbeats."""
    return f"service:{instance_id}"


@dataclass(frozen=True, slots=True)
class Listing:
    states: list[InstanceState]
    nodes: dict[str, list[str]]  # instance id -> the nodes holding a copy (alive first)

    @property
    def duplicates(self) -> dict[str, list[str]]:
        return {i: n for i, n in self.nodes.items() if len(n) > 1}


def read_listing(entries: Sequence[dict[str, Any]] | None) -> Listing:
    best: dict[str, tuple[tuple[bool, int], InstanceState]] = {}
    nodes: dict[str, list[tuple[bool, str]]] = {}
    for entry in entries or []:
        svc = entry["Service"]
        node = entry.get("Node") or {}
        checks = entry.get("Checks") or []
        own = next((c for c in checks if c.get("CheckID") == check_id(svc["ID"])), None)
        others = [c for c in checks if c is not own]
        alive = bool(checks) and (own is None or own.get("Status") in _ALIVE)
        healthy = alive and all(c.get("Status") == "passing" for c in others)
        output = own.get("Output") if own else ""
        state = InstanceState(
            info=info_from_meta(
                svc["ID"], svc.get("Address") or node.get("Address", ""),
                int(svc.get("Port") or 0), svc.get("Tags"), svc.get("Meta"),
            ),
            load=load_from_json(output),
            healthy=healthy,
            last_heartbeat=sent_at_from_json(output),
        )  # fmt: skip
        rank = (healthy, int((own or {}).get("ModifyIndex") or 0))
        nodes.setdefault(svc["ID"], []).append((not healthy, str(node.get("Node", ""))))
        if svc["ID"] not in best or rank > best[svc["ID"]][0]:
            best[svc["ID"]] = (rank, state)
    states = sorted((s for _, s in best.values()), key=lambda s: s.info.id)
    return Listing(states, {i: [name for _, name in sorted(n)] for i, n in nodes.items()})
