"""A Consul client agent as the double models it: local state, synced late.

An agent owns the services and checks registered through *it*
(``/v1/agent/...`` is always local), runs their TTL timers, and pushes them to
its datacenter's catalog (:class:`~tests.registry.consul_state.ConsulState`)
the way Consul's ``agent/local/state.go`` does:

* a status change is synced at once, with the latest output;
* an update that changes only the output is stored locally and synced after
  ``check_update_interval/2`` plus a random stagger of up to
  ``check_update_interval`` (default 5m, so 2.5-7.5 min);
* a periodic anti-entropy sync (``ae_interval``, 1m here) also pushes an
  output that differs, but only for checks with no deferred sync pending;
* registering a check whose ID the agent already holds keeps its status and
  output (``addServiceInternal`` restores them from a snapshot); a check
  definition has no ``Output``, and its status defaults to ``critical``;
* a TTL check not updated within its TTL turns ``critical`` with output
  ``TTL expired (last output before timeout follows): ...``; output longer
  than ``check_output_max_size`` (4096) is cut;
* ``DeregisterCriticalServiceAfter`` is raised to
  ``check_deregister_interval_min`` (1m), and the reaper that applies it runs
  every ``check_reap_interval`` (30s), counting from when the check *turned*
  critical (a check registered critical is not reaped before its TTL runs
  out).

Every timing defaults to Consul's; tests that lower one say so.
"""

from __future__ import annotations

import random
import re
import uuid
from dataclasses import dataclass, field
from typing import Any

from tests.registry.consul_state import ConsulState, HTTPError, go_string, norm, parse_duration

__all__ = ["AgentConfig", "ConsulAgent"]

# What a service definition / check type decodes (agent/structs, normalized
# keys: Consul's decoder matches case-insensitively and translates snake_case;
# lib.DecodeJSON disallows any other field).
_SERVICE_FIELDS = {norm({k: 0}).popitem()[0] for k in (
    "Kind", "ID", "Name", "Tags", "Address", "TaggedAddresses", "Meta", "Port", "SocketPath",
    "Check", "Checks", "Weights", "Token", "EnableTagOverride", "Proxy", "Connect", "Locality",
    "Namespace", "Partition",
)}  # fmt: skip
_CHECK_FIELDS = {norm({k: 0}).popitem()[0] for k in (
    "CheckID", "ID", "Name", "Status", "Notes", "ScriptArgs", "Args", "HTTP", "Header", "Method",
    "Body", "DisableRedirects", "TCP", "TCPUseTLS", "UDP", "Interval", "AliasNode",
    "AliasService", "DockerContainerID", "Shell", "GRPC", "GRPCUseTLS", "H2PING",
    "H2PingUseTLS", "OSService", "TLSServerName", "TLSSkipVerify", "Timeout", "TTL",
    "SuccessBeforePassing", "FailuresBeforeWarning", "FailuresBeforeCritical", "ProxyHTTP",
    "ProxyGRPC", "DeregisterCriticalServiceAfter", "OutputMaxSize", "ServiceID",
)}  # fmt: skip
_STATUSES = ("passing", "warning", "critical")
_META_KEY = re.compile(r"^[a-zA-Z0-9_-]+$")


@dataclass
class AgentConfig:
    """Agent settings that shape what clients see; Consul's defaults."""

    check_update_interval_s: float = 300.0  # check_update_interval = "5m"
    ae_interval_s: float = 60.0  # anti-entropy full sync (scaled up with cluster size)
    check_reap_interval_s: float = 30.0  # not user-configurable in Consul
    check_deregister_interval_min_s: float = 60.0  # not user-configurable either
    check_output_max_size: int = 4096
    discard_check_output: bool = False


@dataclass
class _LocalService:
    id: str
    name: str
    address: str
    port: int
    tags: list[str]
    meta: dict[str, str] | None


@dataclass
class _LocalCheck:
    check_id: str
    name: str
    service_id: str
    ttl_s: float
    deregister_after_s: float | None
    status: str
    notes: str = ""
    output: str = ""
    last_output: str = ""
    expires: float = 0.0
    critical_since: float | None = None
    defer_at: float | None = None


def _refuse_unknown(body: dict[str, Any], known: set[str]) -> None:
    for key in body:
        if norm({key: 0}).popitem()[0] not in known:
            raise HTTPError(400, f'Request decode failed: json: unknown field "{key}"')


def _meta_error(meta: dict[str, Any]) -> str | None:
    """structs.ValidateServiceMetadata, with Consul's messages."""
    if len(meta) > 64:
        return "Node metadata cannot contain more than 64 key/value pairs"
    for key, value in meta.items():
        problem = None
        if key == "":
            problem = "Key cannot be blank"
        elif not _META_KEY.match(key):
            problem = "Key contains invalid characters"
        elif len(key) > 128:
            problem = "Key is too long (limit: 128 characters)"
        elif key.startswith("consul-"):
            problem = "Key prefix 'consul-' is reserved for internal use"
        elif len(str(value).encode()) > 512:
            problem = "Value is too long (limit: 512 characters)"
        if problem:
            return f"Couldn't load metadata pair ('{key}', '{value}'): {problem}"
    return None


@dataclass
class ConsulAgent:
    """One client agent (one node) of ``dc``; joins it on creation."""

    dc: ConsulState
    node: str = "node-1"
    address: str = "127.0.0.1"
    config: AgentConfig = field(default_factory=AgentConfig)
    node_id: str = field(default_factory=lambda: str(uuid.uuid4()))
    services: dict[str, _LocalService] = field(default_factory=dict)
    checks: dict[str, _LocalCheck] = field(default_factory=dict)
    rng: random.Random = field(default_factory=random.Random)

    def __post_init__(self) -> None:
        now = self.dc.clock()
        self._next_ae = now + self.config.ae_interval_s
        self._next_reap = now + self.config.check_reap_interval_s
        self.dc.join(self)

    # -- writes (agent endpoints) -------------------------------------------

    def register(self, body: dict[str, Any], now: float, replace_existing: bool) -> None:
        _refuse_unknown(body, _SERVICE_FIELDS)
        b = norm(body)
        name = b.get("name")
        if not name:
            raise HTTPError(400, "Missing service name")
        address = b.get("address") or ""
        if address in ("0.0.0.0", "::", "[::]"):
            raise HTTPError(400, "Invalid service address")
        meta = b.get("meta") or None
        if meta and (problem := _meta_error(meta)):
            raise HTTPError(400, f"Invalid Service Meta: {problem}")
        sid = b.get("id") or name
        defs = b.get("checks") or ([b["check"]] if b.get("check") else [])
        checks = [self._check_type(c, sid, name, i, len(defs)) for i, c in enumerate(defs)]
        svc = _LocalService(sid, name, address, int(b.get("port") or 0),
                            list(b.get("tags") or []), meta)  # fmt: skip
        self.services[sid] = svc
        for chk in checks:
            prev = self.checks.get(chk.check_id)
            if prev is not None:  # restore status and output from the snapshot
                chk.status, chk.output, chk.last_output = prev.status, prev.output, prev.output
            chk.expires = now + chk.ttl_s
            self.checks[chk.check_id] = chk
        if replace_existing:
            keep = {c.check_id for c in checks}
            for cid in [c for c, chk in self.checks.items() if chk.service_id == sid]:
                if cid not in keep:
                    del self.checks[cid]
                    self.dc.remove_check(self.node, cid)
        self._push_service(svc)

    def _check_type(self, raw: dict[str, Any], sid: str, name: str, i: int, n: int) -> _LocalCheck:
        _refuse_unknown(raw, _CHECK_FIELDS)
        c = norm(raw)
        status = c.get("status") or "critical"
        if status not in _STATUSES:
            raise HTTPError(400, "Status for checks must 'passing', 'warning', 'critical'")
        if not c.get("ttl"):
            raise HTTPError(400, "consul double: only TTL checks are modelled")
        cid = c.get("checkid") or c.get("id") or (f"service:{sid}" + (f":{i + 1}" if n > 1 else ""))
        dereg = c.get("deregistercriticalserviceafter")
        after = None
        if dereg:
            after = max(parse_duration(dereg), self.config.check_deregister_interval_min_s)
        return _LocalCheck(
            cid, c.get("name") or f"Service '{name}' check", sid, parse_duration(c["ttl"]),
            after, status, notes=c.get("notes") or "",
        )  # fmt: skip

    def deregister(self, sid: str) -> bool:
        if self.services.pop(sid, None) is None:
            return False
        for cid in [c for c, chk in self.checks.items() if chk.service_id == sid]:
            del self.checks[cid]
        self.dc.remove_service(self.node, sid)
        return True

    def update_check(self, cid: str, status: str, output: str, now: float) -> None:
        """A TTL update (CheckTTL.SetStatus, then State.UpdateCheck)."""
        chk = self.checks.get(cid)
        if chk is None:
            raise HTTPError(
                404, f'Unknown check ID "{cid}". Ensure that the check ID is passed, not the'
                " check name.",
            )  # fmt: skip
        limit = self.config.check_output_max_size
        if len(output.encode()) > limit:
            total = len(output.encode())
            cut = output.encode()[:limit].decode(errors="ignore")
            output = f"{cut} ... (captured {limit} of {total} bytes)"
        chk.last_output = output
        chk.expires = now + chk.ttl_s
        self._update(chk, status, output, now)

    def _update(self, chk: _LocalCheck, status: str, output: str, now: float) -> None:
        if self.config.discard_check_output:
            output = ""
        if status == "critical":
            if chk.critical_since is None:
                chk.critical_since = now
        else:
            chk.critical_since = None
        if chk.status == status and chk.output == output:
            return
        interval = self.config.check_update_interval_s
        if interval > 0 and chk.status == status:
            chk.output = output  # output only: sync later
            if chk.defer_at is None:
                chk.defer_at = now + interval / 2 + self.rng.uniform(0, interval)
            return
        chk.status, chk.output = status, output
        self._push_check(chk)

    # -- time ---------------------------------------------------------------

    def advance(self, now: float) -> None:
        for chk in list(self.checks.values()):
            if chk.status != "critical" and now >= chk.expires:
                expired = "TTL expired (last output before timeout follows): " + chk.last_output
                self._update(chk, "critical", expired, chk.expires)
            if chk.defer_at is not None and now >= chk.defer_at:
                chk.defer_at = None
                self._push_check(chk)
        ae = self.config.ae_interval_s
        if self._next_ae <= now or ae <= 0:
            for chk in self.checks.values():
                if chk.defer_at is None:
                    self._push_check(chk)
            while ae > 0 and self._next_ae <= now:
                self._next_ae += ae
        reap = self.config.check_reap_interval_s
        while self._next_reap <= now or reap <= 0:
            tick = now if reap <= 0 else self._next_reap
            for chk in list(self.checks.values()):
                if (
                    chk.status == "critical"
                    and chk.deregister_after_s is not None
                    and chk.critical_since is not None
                    and tick - chk.critical_since >= chk.deregister_after_s
                ):
                    self.deregister(chk.service_id)
            if reap <= 0:
                break
            self._next_reap += reap

    # -- sync to the servers ------------------------------------------------

    def _push_service(self, svc: _LocalService) -> None:
        self.dc.sync_service(self.node, svc.id, svc.name, svc.address, svc.port, svc.tags,
                             svc.meta)  # fmt: skip
        for chk in self.checks.values():
            if chk.service_id == svc.id:
                self._push_check(chk)

    def _push_check(self, chk: _LocalCheck) -> None:
        self.dc.sync_check(self.node, chk.check_id, chk.name, chk.service_id, chk.status,
                           chk.output, chk.notes)  # fmt: skip

    # -- reads --------------------------------------------------------------

    def self_json(self) -> dict[str, Any]:
        """``/v1/agent/self``: Config plus the runtime config (DebugConfig)."""

        c = self.config
        return {
            "Config": {"Datacenter": self.dc.datacenter, "NodeName": self.node,
                       "NodeID": self.node_id, "Server": False, "Version": "1.20.1"},
            "DebugConfig": {
                "Datacenter": self.dc.datacenter, "NodeName": self.node,
                "CheckUpdateInterval": go_string(c.check_update_interval_s),
                "CheckReapInterval": go_string(c.check_reap_interval_s),
                "CheckDeregisterIntervalMin": go_string(c.check_deregister_interval_min_s),
                "CheckOutputMaxSize": c.check_output_max_size,
                "DiscardCheckOutput": c.discard_check_output,
                "SessionTTLMin": go_string(self.dc.session_ttl_min_s),
                "AEInterval": go_string(c.ae_interval_s),
            },
            "Member": {"Name": self.node, "Addr": self.address, "Port": 8301, "Status": 1},
            "Meta": {},
        }  # fmt: skip
