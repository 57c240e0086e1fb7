"""The Consul double's servers: one datacenter's catalog, KV and sessions.

Pure data and rules, no HTTP: :mod:`tests.registry.consul_double` serves it
through agents (:mod:`tests.registry.consul_agent`), which keep their own
services and checks and *sync* them here, as Consul's anti-entropy does. The
catalog is what health queries read, per node. Every mutation bumps one
raft-like index; see :mod:`tests.registry.consul_double` for what is and is
not modelled.
"""

from __future__ import annotations

import base64
import re
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from tests.registry.consul_acl import ALL_RIGHTS, Acl, Rights

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

_UNITS = {"ns": 1e-9, "us": 1e-6, "µs": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0, "h": 3600.0}
NODE = "consul-double"


def parse_duration(text: str) -> float:
    """A Go duration (``"1m30s"``, ``"250ms"``) in seconds."""
    parts = re.findall(r"([\d.]+)(ns|us|µs|ms|s|m|h)", text)
    if not parts or "".join(n + u for n, u in parts) != text.strip():
        if text.strip() == "0":
            return 0.0
        raise ValueError(f"time: invalid duration {text!r}")
    return sum(float(n) * _UNITS[u] for n, u in parts)


def go_string(seconds: float) -> str:
    """Go's ``time.Duration.String()``: ``5m0s``, ``30s``, ``500ms``."""
    if seconds == 0:
        return "0s"
    if seconds < 1:
        return f"{seconds * 1000:g}ms"
    whole = int(seconds)
    h, rest = divmod(whole, 3600)
    m, s = divmod(rest, 60)
    sec = f"{s + seconds - whole:g}s"
    return f"{h}h{m}m{sec}" if h else f"{m}m{sec}" if m else sec


def norm(body: dict[str, Any]) -> dict[str, Any]:
    """Case- and underscore-insensitive keys, as Consul's decoder accepts."""
    return {k.lower().replace("_", ""): v for k, v in body.items()}


class HTTPError(Exception):
    def __init__(self, status: int, text: str) -> None:
        self.status, self.text = status, text


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
class _KV:
    key: str
    value: bytes | None
    flags: int = 0
    lock_index: int = 0
    session: str | None = None
    create_index: int = 0
    modify_index: int = 0


@dataclass
class _Session:
    id: str
    name: str
    ttl_text: str
    ttl_s: float
    behavior: str
    lock_delay_s: float
    expires: float | None
    create_index: int = 0
    modify_index: int = 0
    node: str = NODE


@dataclass
class ConsulState:
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
    kv: dict[str, _KV] = field(default_factory=dict)
    tombstones: dict[str, int] = field(default_factory=dict)
    kvs_index: int = 10
    sessions: dict[str, _Session] = field(default_factory=dict)
    lock_delays: dict[str, float] = field(default_factory=dict)
    requests: int = 0
    lock: threading.RLock = field(default_factory=threading.RLock)

    def __post_init__(self) -> None:
        if self.acl is None and self.acl_token is not None:
            self.acl = Acl(tokens={self.acl_token: ALL_RIGHTS})
        self.wan.setdefault(self.datacenter, self)

    def bump(self) -> int:
        self.index += 1
        return self.index

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

    # -- KV ---------------------------------------------------------------

    def kv_read(self, key: str, recurse: bool) -> tuple[int, list[_KV]]:
        if not recurse:
            entry = self.kv.get(key)
            return (entry.modify_index if entry else self.kvs_index), [entry] if entry else []
        entries = [e for k, e in sorted(self.kv.items()) if k.startswith(key)]
        idx = max(
            [e.modify_index for e in entries]
            + [i for k, i in self.tombstones.items() if k.startswith(key)],
            default=0,
        )
        return idx or self.kvs_index, entries

    def _write_kv(self, key: str, value: bytes | None, flags: int | None) -> _KV:
        idx = self.bump()
        self.kvs_index = idx
        entry = self.kv.get(key)
        if entry is None:
            entry = _KV(key, value, create_index=idx)
            self.kv[key] = entry
            self.tombstones.pop(key, None)
        entry.value, entry.modify_index = value, idx
        if flags is not None:
            entry.flags = flags
        return entry

    def kv_put(self, key: str, value: bytes | None, params: dict[str, str], now: float) -> bool:
        entry = self.kv.get(key)
        if "cas" in params:
            cas = int(params["cas"])
            if (cas == 0 and entry is not None) or (
                cas != 0 and (entry is None or entry.modify_index != cas)
            ):
                return False
        flags = int(params["flags"]) if "flags" in params else None
        if acquire := params.get("acquire"):
            if acquire not in self.sessions:
                raise HTTPError(500, f'invalid session "{acquire}"')
            if now < self.lock_delays.get(key, 0.0):
                return False
            if entry is not None and entry.session not in (None, acquire):
                return False
            fresh = entry is None or entry.session != acquire
            entry = self._write_kv(key, value, flags)
            if fresh:
                entry.session, entry.lock_index = acquire, entry.lock_index + 1
            return True
        if release := params.get("release"):
            if entry is None or entry.session != release:
                return False
            entry = self._write_kv(key, value, flags)
            entry.session = None
            return True
        self._write_kv(key, value, flags)
        return True

    def kv_delete(self, key: str, recurse: bool, cas: int | None) -> bool:
        keys = [k for k in self.kv if k.startswith(key)] if recurse else [key]
        if cas is not None:
            entry = self.kv.get(key)
            if cas == 0 or entry is None or entry.modify_index != cas:
                return False
        idx = self.bump()
        for k in keys:
            if self.kv.pop(k, None) is not None:
                self.tombstones[k] = idx
                self.kvs_index = idx
        return True

    @staticmethod
    def kv_json(e: _KV) -> dict[str, Any]:
        out: dict[str, Any] = {
            "LockIndex": e.lock_index,
            "Key": e.key,
            "Flags": e.flags,
            "Value": base64.b64encode(e.value).decode() if e.value else None,
            "CreateIndex": e.create_index,
            "ModifyIndex": e.modify_index,
        }
        if e.session:
            out["Session"] = e.session
        return out

    # -- sessions ---------------------------------------------------------

    def session_create(self, body: dict[str, Any], now: float, node: str = NODE) -> str:
        b = norm(body)
        ttl_text = b.get("ttl") or ""
        ttl = parse_duration(ttl_text) if ttl_text else 0.0
        if ttl and not self.session_ttl_min_s <= ttl <= 86400:
            raise HTTPError(
                500,
                f"Invalid Session TTL '{int(ttl * 1e9)}', must be between"
                f" [{go_string(self.session_ttl_min_s)}=24h0m0s]",
            )
        behavior = b.get("behavior") or "release"
        if behavior not in ("release", "delete"):
            raise HTTPError(400, f"Invalid Behavior setting '{behavior}'")
        delay: Any = b.get("lockdelay", "15s")
        if isinstance(delay, str):
            delay_s = parse_duration(delay)
        else:
            delay_s = float(delay) if delay < 1000 else float(delay) / 1e9
        idx = self.bump()
        sid = str(uuid.uuid4())
        self.sessions[sid] = _Session(
            sid, b.get("name") or "", ttl_text, ttl, behavior, delay_s,
            now + 2 * ttl if ttl else None, idx, idx, node,
        )  # fmt: skip
        return sid

    def session_renew(self, sid: str, now: float) -> dict[str, Any]:
        sess = self.sessions.get(sid)
        if sess is None:
            raise HTTPError(404, f"Session id '{sid}' not found")
        if sess.ttl_s:
            sess.expires = now + 2 * sess.ttl_s
        return self.session_json(sess)

    def invalidate(self, sid: str, now: float) -> None:
        sess = self.sessions.pop(sid, None)
        if sess is None:
            return
        for entry in [e for e in self.kv.values() if e.session == sid]:
            if sess.behavior == "delete":
                self.kv_delete(entry.key, False, None)
            else:
                idx = self.bump()
                entry.session, entry.modify_index, self.kvs_index = None, idx, idx
            if sess.lock_delay_s:
                self.lock_delays[entry.key] = now + sess.lock_delay_s

    @staticmethod
    def session_json(s: _Session) -> dict[str, Any]:
        return {
            "ID": s.id, "Name": s.name, "Node": s.node, "LockDelay": int(s.lock_delay_s * 1e9),
            "Behavior": s.behavior, "TTL": s.ttl_text, "NodeChecks": ["serfHealth"],
            "ServiceChecks": None, "CreateIndex": s.create_index, "ModifyIndex": s.modify_index,
        }  # fmt: skip
