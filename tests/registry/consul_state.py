"""The Consul double's state machine: catalog, TTL checks, KV, sessions.

Pure data and rules, no HTTP: :mod:`tests.registry.consul_double` serves it.
Every mutation bumps one raft-like index; see that module's docstring for
what is and is not modelled.
"""

from __future__ import annotations

import base64
import re
import threading
import uuid
from dataclasses import dataclass, field
from typing import Any

__all__ = ["NODE", "ConsulState", "HTTPError", "norm", "parse_duration"]

_UNITS = {"ns": 1e-9, "us": 1e-6, "µs": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0, "h": 3600.0}
_CHECK_OUTPUT_MAX = 4096
NODE = "consul-double"


def parse_duration(text: str) -> float:
    """A Go duration (``"1m30s"``, ``"250ms"``) in seconds."""
    parts = re.findall(r"([\d.]+)(ns|us|µs|ms|s|m|h)", text)
    if not parts or "".join(n + u for n, u in parts) != text.strip():
        if text.strip() == "0":
            return 0.0
        raise ValueError(f"time: invalid duration {text!r}")
    return sum(float(n) * _UNITS[u] for n, u in parts)


def norm(body: dict[str, Any]) -> dict[str, Any]:
    """Case- and underscore-insensitive keys, as Consul's decoder accepts."""
    return {k.lower().replace("_", ""): v for k, v in body.items()}


class HTTPError(Exception):
    def __init__(self, status: int, text: str) -> None:
        self.status, self.text = status, text


@dataclass
class _Check:
    check_id: str
    name: str
    service_id: str
    ttl_s: float
    deregister_after_s: float | None
    status: str = "critical"
    output: str = ""
    notes: str = ""
    expires: float = 0.0
    critical_since: float | None = None
    create_index: int = 0
    modify_index: int = 0


@dataclass
class _Service:
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


@dataclass
class ConsulState:
    """Everything the double knows; shared by restarts of its HTTP server."""

    deregister_floor_s: float = 60.0
    session_ttl_min_s: float = 10.0
    acl_token: str | None = None
    leader: bool = True
    index: int = 10
    node_id: str = field(default_factory=lambda: str(uuid.uuid4()))
    services: dict[str, _Service] = field(default_factory=dict)
    checks: dict[str, _Check] = field(default_factory=dict)
    service_index: dict[str, int] = field(default_factory=dict)
    catalog_index: int = 10
    kv: dict[str, _KV] = field(default_factory=dict)
    tombstones: dict[str, int] = field(default_factory=dict)
    kvs_index: int = 10
    sessions: dict[str, _Session] = field(default_factory=dict)
    lock_delays: dict[str, float] = field(default_factory=dict)
    requests: int = 0
    lock: threading.RLock = field(default_factory=threading.RLock)

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

    # -- catalog ----------------------------------------------------------

    def _touch_service(self, name: str) -> int:
        idx = self.bump()
        self.service_index[name] = idx
        self.catalog_index = idx
        return idx

    def advance(self, now: float) -> None:
        """Apply what time did: TTL checks expire, critical services are
        reaped, sessions time out."""
        for check in list(self.checks.values()):
            if check.status != "critical" and now >= check.expires:
                check.status, check.output, check.critical_since = "critical", "TTL expired", now
                check.modify_index = self._touch_service(self.services[check.service_id].name)
            if (
                check.status == "critical"
                and check.deregister_after_s is not None
                and check.critical_since is not None
                and now - check.critical_since >= check.deregister_after_s
            ):
                self.remove_service(check.service_id)
        for session in list(self.sessions.values()):
            if session.expires is not None and now >= session.expires:
                self.invalidate(session.id, now)

    def remove_service(self, service_id: str) -> bool:
        svc = self.services.pop(service_id, None)
        if svc is None:
            return False
        for cid in [c for c, chk in self.checks.items() if chk.service_id == service_id]:
            del self.checks[cid]
        self._touch_service(svc.name)
        return True

    def register(self, body: dict[str, Any], now: float) -> None:
        b = norm(body)
        name = b.get("name")
        if not name:
            raise HTTPError(400, "Missing service name")
        sid = b.get("id") or name
        checks = b.get("checks") or ([b["check"]] if b.get("check") else [])
        if len(checks) > 1:
            raise HTTPError(400, "consul double: one check per service is modelled")
        svc = self.services.get(sid)
        meta = b.get("meta")
        idx = self._touch_service(name)
        if svc is None:
            svc = _Service(sid, name, "", 0, [], None, create_index=idx)
            self.services[sid] = svc
        svc.name, svc.address, svc.port = name, b.get("address") or "", int(b.get("port") or 0)
        svc.tags, svc.meta, svc.modify_index = list(b.get("tags") or []), meta or None, idx
        if checks:
            c = norm(checks[0])
            if not c.get("ttl"):
                raise HTTPError(400, "consul double: only TTL checks are modelled")
            cid = c.get("checkid") or c.get("id") or f"service:{sid}"
            ttl = parse_duration(c["ttl"])
            dereg = c.get("deregistercriticalserviceafter")
            after = max(parse_duration(dereg), self.deregister_floor_s) if dereg else None
            status = c.get("status") or "critical"
            if status not in ("passing", "warning", "critical"):
                raise HTTPError(400, f"Invalid Check Status: {status!r}")
            old = self.checks.get(cid)
            chk = _Check(
                cid,
                c.get("name") or f"Service '{name}' check",
                sid,
                ttl,
                after,
                status=status,
                notes=c.get("notes") or "",
                expires=now + ttl,
                critical_since=now if status == "critical" else None,
                create_index=old.create_index if old else idx,
                modify_index=idx,
            )
            self.checks[cid] = chk
        if b.get("replaceexistingchecks"):
            keep = {f"service:{sid}"} | {
                norm(c).get("checkid") or norm(c).get("id") or "" for c in checks
            }
            for cid in [x for x, chk in self.checks.items() if chk.service_id == sid]:
                if cid not in keep:
                    del self.checks[cid]

    def update_check(self, check_id: str, status: str, output: str, now: float) -> None:
        chk = self.checks.get(check_id)
        if chk is None:
            raise HTTPError(
                404,
                f'Unknown check ID "{check_id}". Ensure that the check ID is passed,'
                " not the check name.",
            )
        output = output.encode()[:_CHECK_OUTPUT_MAX].decode(errors="ignore")
        chk.expires = now + chk.ttl_s
        chk.critical_since = now if status == "critical" else None
        if chk.status == status and chk.output == output:
            return
        chk.status, chk.output = status, output
        chk.modify_index = self._touch_service(self.services[chk.service_id].name)

    def health_service(self, name: str, passing: bool) -> tuple[int, list[dict[str, Any]]]:
        out = []
        for svc in sorted(self.services.values(), key=lambda s: s.id):
            if svc.name != name:
                continue
            checks = [c for c in self.checks.values() if c.service_id == svc.id]
            if passing and any(c.status != "passing" for c in checks):
                continue
            out.append(
                {
                    "Node": self._node_json(),
                    "Service": self._service_json(svc),
                    "Checks": [self._serf_json()] + [self._check_json(c, svc) for c in checks],
                }
            )
        return self.service_index.get(name) or self.catalog_index, out

    def _node_json(self) -> dict[str, Any]:
        return {
            "ID": self.node_id,
            "Node": NODE,
            "Address": "127.0.0.1",
            "Datacenter": "dc1",
            "TaggedAddresses": {"lan": "127.0.0.1", "lan_ipv4": "127.0.0.1",
                                "wan": "127.0.0.1", "wan_ipv4": "127.0.0.1"},
            "Meta": {"consul-network-segment": ""},
            "CreateIndex": 5,
            "ModifyIndex": 5,
        }  # fmt: skip

    @staticmethod
    def _service_json(svc: _Service) -> dict[str, Any]:
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
    def _serf_json() -> dict[str, Any]:
        return {
            "Node": NODE, "CheckID": "serfHealth", "Name": "Serf Health Status",
            "Status": "passing", "Notes": "", "Output": "Agent alive and reachable",
            "ServiceID": "", "ServiceName": "", "ServiceTags": [], "Type": "",
            "Interval": "", "Timeout": "", "ExposedPort": 0, "Definition": {},
            "CreateIndex": 5, "ModifyIndex": 5,
        }  # fmt: skip

    @staticmethod
    def _check_json(c: _Check, svc: _Service) -> dict[str, Any]:
        return {
            "Node": NODE, "CheckID": c.check_id, "Name": c.name, "Status": c.status,
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

    def session_create(self, body: dict[str, Any], now: float) -> str:
        b = norm(body)
        ttl_text = b.get("ttl") or ""
        ttl = parse_duration(ttl_text) if ttl_text else 0.0
        if ttl and not self.session_ttl_min_s <= ttl <= 86400:
            raise HTTPError(
                500,
                f"Invalid Session TTL '{int(ttl * 1e9)}', must be between"
                f" [{self.session_ttl_min_s}s=24h0m0s]",
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
            now + 2 * ttl if ttl else None, idx, idx,
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
            "ID": s.id, "Name": s.name, "Node": NODE, "LockDelay": int(s.lock_delay_s * 1e9),
            "Behavior": s.behavior, "TTL": s.ttl_text, "NodeChecks": ["serfHealth"],
            "ServiceChecks": None, "CreateIndex": s.create_index, "ModifyIndex": s.modify_index,
        }  # fmt: skip
