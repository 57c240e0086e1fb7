"""The Consul double's servers: one datacenter's catalog, KV and sessions.

Pure data and rules, no HTTP: :mod:`tests.registry.consul_double` serves it
through agents (:mod:`tests.registry.consul_agent`), which keep their own
services and checks and *sync* them here, as Consul's anti-entropy does. The
catalog is what health queries read, per node. Every mutation bumps one
raft-like index; see :mod:`tests.registry.consul_double` for what is and is
not modelled.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from tests.registry.consul_acl import ALL_RIGHTS, Acl, Rights
from tests.registry.consul_kv import KVAndSessions, KVItem, SessionItem
from tests.registry.consul_wire import NODE, HTTPError, go_string, norm, parse_duration

if TYPE_CHECKING:
    from tests.registry.consul_agent import ConsulAgent

__all__ = [
    "NODE",
    "CatalogCheck",
    "CatalogService",
    "ConsulState",
    "HTTPError",
    "federate",
    "go_string",
    "norm",
    "parse_duration",
]


def federate(*datacenters: ConsulState) -> None:
    """WAN-join datacenters: a ``?dc=`` query to any of them reaches the others."""
    shared: dict[str, ConsulState] = {}
    for dc in datacenters:
        shared[dc.datacenter] = dc
        dc.wan = shared


@dataclass
class CatalogCheck:
    """A check as the servers hold it: what an agent last synced."""

    node: str
    check_id: str
    name: str
    service_id: str
    service_name: str
    status: str
    output: str
    notes: str = ""
    create_index: int = 0
    modify_index: int = 0


@dataclass
class CatalogService:
    node: str
    id: str
    name: str
    address: str
    port: int
    tags: list[str]
    meta: dict[str, str] | None
    create_index: int = 0
    modify_index: int = 0


@dataclass
class ConsulState(KVAndSessions):
    """One datacenter's servers; shared by restarts of the agents' HTTP servers.

    ``acl`` turns ACLs on (``acl_token`` is a shorthand: one token with every
    right, nothing for the anonymous token). ``clock`` is the time every
    agent and session of this datacenter sees (tests may drive it by hand).
    """

    datacenter: str = "dc1"
    session_ttl_min_s: float = 10.0
    acl: Acl | None = None
    acl_token: str | None = None
    leader: bool = True
    clock: Callable[[], float] = time.monotonic
    index: int = 10
    services: dict[tuple[str, str], CatalogService] = field(default_factory=dict)
    checks: dict[tuple[str, str], CatalogCheck] = field(default_factory=dict)
    nodes: dict[str, str] = field(default_factory=dict)  # node name -> node ID
    agents: dict[str, ConsulAgent] = field(default_factory=dict)
    wan: dict[str, ConsulState] = field(default_factory=dict)  # datacenters by name
    service_index: dict[str, int] = field(default_factory=dict)
    catalog_index: int = 10
    kv: dict[str, KVItem] = field(default_factory=dict)
    tombstones: dict[str, int] = field(default_factory=dict)
    kvs_index: int = 10
    sessions: dict[str, SessionItem] = field(default_factory=dict)
    lock_delays: dict[str, float] = field(default_factory=dict)
    requests: int = 0
    lock: threading.RLock = field(default_factory=threading.RLock)

    def __post_init__(self) -> None:
        if self.acl is None and self.acl_token is not None:
            self.acl = Acl(tokens={self.acl_token: ALL_RIGHTS})
        self.wan.setdefault(self.datacenter, self)

    def rewind(self, by: int = 5) -> None:
        """Lower every index, as after a snapshot restore or a fresh leader:
        clients holding newer indexes must notice and reset."""
        with self.lock:
            self.index = max(1, self.index - by)
            self.catalog_index = min(self.catalog_index, self.index)
            self.kvs_index = min(self.kvs_index, self.index)
            self.service_index = {k: min(v, self.index) for k, v in self.service_index.items()}

    def rights(self, token: str) -> Rights:
        """Who the token is (raises ``AclDenied`` for an unknown one)."""
        if self.acl is None:
            return Rights(token, ALL_RIGHTS)
        return self.acl.resolve(token)

    def route(self, dc: str | None) -> ConsulState:
        """The datacenter a ``?dc=`` query goes to (servers forward over the WAN)."""
        if not dc or dc == self.datacenter:
            return self
        if dc not in self.wan:
            raise HTTPError(500, "No path to datacenter")
        return self.wan[dc]

    def agent(self, node: str) -> ConsulAgent:
        return self.agents[node]

    def default_agent(self) -> ConsulAgent:
        """The one agent of a single-node test (created on first use)."""
        from tests.registry.consul_agent import ConsulAgent

        return self.agents.get(NODE) or ConsulAgent(self, node=NODE)

    # -- catalog (what agents sync) ---------------------------------------

    def _touch_service(self, name: str) -> int:
        idx = self.bump()
        self.service_index[name] = idx
        self.catalog_index = idx
        return idx

    def advance(self, now: float) -> None:
        """Apply what time did on every agent (TTLs, deferred syncs, the
        reaper), then to sessions."""
        for agent in list(self.agents.values()):
            agent.advance(now)
        for session in list(self.sessions.values()):
            if session.expires is not None and now >= session.expires:
                self.invalidate(session.id, now)

    def join(self, agent: ConsulAgent) -> None:
        self.agents[agent.node] = agent
        self.nodes[agent.node] = agent.node_id

    def sync_service(
        self, node: str, sid: str, name: str, address: str, port: int, tags: list[str],
        meta: dict[str, str] | None,
    ) -> None:  # fmt: skip
        old = self.services.get((node, sid))
        shape = (name, address, port, tags, meta)
        if old is not None and (old.name, old.address, old.port, old.tags, old.meta) == shape:
            return
        idx = self._touch_service(name)
        self.services[(node, sid)] = CatalogService(
            node, sid, name, address, port, list(tags), meta,
            create_index=old.create_index if old else idx, modify_index=idx,
        )  # fmt: skip

    def sync_check(
        self, node: str, cid: str, name: str, sid: str, status: str, output: str, notes: str
    ) -> None:
        svc = self.services.get((node, sid))
        if svc is None:
            return
        old = self.checks.get((node, cid))
        if old is not None and (old.name, old.status, old.output, old.notes) == (
            name, status, output, notes,
        ):  # fmt: skip
            return
        idx = self._touch_service(svc.name)
        self.checks[(node, cid)] = CatalogCheck(
            node, cid, name, sid, svc.name, status, output, notes,
            create_index=old.create_index if old else idx, modify_index=idx,
        )  # fmt: skip

    def remove_check(self, node: str, cid: str) -> None:
        chk = self.checks.pop((node, cid), None)
        if chk is not None:
            self._touch_service(chk.service_name)

    def remove_service(self, node: str, sid: str) -> bool:
        svc = self.services.pop((node, sid), None)
        if svc is None:
            return False
        for key in [k for k, c in self.checks.items() if k[0] == node and c.service_id == sid]:
            del self.checks[key]
        self._touch_service(svc.name)
        return True

    def check(self, cid: str, node: str = "") -> CatalogCheck:
        """The synced check ``cid`` (on ``node``, or the only node holding it)."""
        found = [c for (n, i), c in self.checks.items() if i == cid and (not node or n == node)]
        if len(found) != 1:
            raise KeyError(f"{len(found)} catalog checks {cid!r}")
        return found[0]

    def health_service(
        self, name: str, passing: bool, rights: Rights
    ) -> tuple[int, list[dict[str, Any]], bool]:
        """Index, entries and whether ACLs hid any (Health.ServiceNodes)."""
        out, hidden = [], False
        for (node, _), svc in sorted(self.services.items()):
            if svc.name != name:
                continue
            if not (rights.allows("service") and rights.allows("node")):
                hidden = True
                continue
            checks = [c for (n, _), c in sorted(self.checks.items()) if n == node
                      and c.service_id == svc.id]  # fmt: skip
            if passing and any(c.status != "passing" for c in checks):
                continue
            out.append(
                {
                    "Node": self._node_json(node),
                    "Service": self._service_json(svc),
                    "Checks": [self._serf_json(node)] + [self._check_json(c, svc) for c in checks],
                }
            )
        return self.service_index.get(name) or self.catalog_index, out, hidden

    def _node_json(self, node: str) -> dict[str, Any]:
        address = self.agents[node].address if node in self.agents else "127.0.0.1"
        return {
            "ID": self.nodes.get(node, ""),
            "Node": node,
            "Address": address,
            "Datacenter": self.datacenter,
            "TaggedAddresses": {"lan": address, "lan_ipv4": address,
                                "wan": address, "wan_ipv4": address},
            "Meta": {"consul-network-segment": ""},
            "CreateIndex": 5,
            "ModifyIndex": 5,
        }  # fmt: skip

    @staticmethod
    def _service_json(svc: CatalogService) -> dict[str, Any]:
        return {
            "ID": svc.id,
            "Service": svc.name,
            "Tags": svc.tags,
            "Address": svc.address,
            "Meta": svc.meta,
            "Port": svc.port,
            "Weights": {"Passing": 1, "Warning": 1},
            "EnableTagOverride": False,
            "Proxy": {"Mode": "", "MeshGateway": {}, "Expose": {}},
            "Connect": {},
            "PeerName": "",
            "CreateIndex": svc.create_index,
            "ModifyIndex": svc.modify_index,
        }

    @staticmethod
    def _serf_json(node: str) -> dict[str, Any]:
        return {
            "Node": node, "CheckID": "serfHealth", "Name": "Serf Health Status",
            "Status": "passing", "Notes": "", "Output": "Agent alive and reachable",
            "ServiceID": "", "ServiceName": "", "ServiceTags": [], "Type": "",
            "Interval": "", "Timeout": "", "ExposedPort": 0, "Definition": {},
            "CreateIndex": 5, "ModifyIndex": 5,
        }  # fmt: skip

    @staticmethod
    def _check_json(c: CatalogCheck, svc: CatalogService) -> dict[str, Any]:
        return {
            "Node": c.node, "CheckID": c.check_id, "Name": c.name, "Status": c.status,
            "Notes": c.notes, "Output": c.output, "ServiceID": svc.id,
            "ServiceName": svc.name, "ServiceTags": svc.tags, "Type": "ttl",
            "Interval": "", "Timeout": "", "ExposedPort": 0, "Definition": {},
            "CreateIndex": c.create_index, "ModifyIndex": c.modify_index,
        }  # fmt: skip
