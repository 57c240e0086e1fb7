"""An HTTP double of the Consul agent API, served on a real socket.

It speaks the endpoints the registry's Consul backend (through ``py-consul``)
uses, with Consul's JSON bodies (PascalCase fields, base64 ``Value`` or
``null``, ``null`` service ``Meta`` when none was registered, ``Flags``,
``LockIndex``, ``Session`` only while held), status codes (404 with an empty
body and an ``X-Consul-Index`` for a missing key, 404 ``Unknown check ID`` for
a heartbeat on a reaped check, ``true``/``false`` bodies for KV writes) and
headers (``X-Consul-Index``, ``X-Consul-KnownLeader``, ``X-Consul-LastContact``).

Modelled behaviour, taken from Consul's API documentation:

* registration bodies are decoded case-insensitively (py-consul sends
  lowercase keys), one TTL check per service; a TTL check turns ``critical``
  with output ``TTL expired`` when not passed within its TTL, and the service
  is deregistered after ``DeregisterCriticalServiceAfter`` (floored at
  ``deregister_floor_s``, 60 s like Consul, lowered by tests for speed);
* an unchanged check update does not move the index; output is capped at
  4096 bytes like ``check_output_max_size``;
* ``/v1/health/service/<name>`` with ``passing`` filters on all checks,
  including the node's ``serfHealth``; the index is per service name, then
  the catalog's;
* blocking queries: ``index`` + ``wait`` (default 5m, max 10m, plus up to
  wait/16 jitter), returning as soon as the index passes the client's; an
  index above the server's blocks for the full wait (what clients see as the
  index going backwards after a restart, see :meth:`ConsulState.rewind`);
* KV: ``cas`` (0 = create only), ``flags``, ``recurse``, ``keys``,
  ``acquire``/``release`` with ``LockIndex``, lock-delay, and a list index
  that counts deletes through tombstones;
* sessions: ``TTL`` bounded by ``session_ttl_min`` (Consul's 10 s default,
  lowered by tests) and 24h, invalidated after twice the TTL without renew
  (Consul's multiplier), ``Behavior`` release/delete, ``LockDelay`` (numbers
  below 1000 read as seconds, as Consul does);
* ACL: with ``acl_token`` set, a request without that token gets
  ``403 ACL not found``; ``leader=False`` answers ``500 No cluster leader``.

Not modelled: multiple nodes/datacenters, gossip and node health
(``serfHealth`` is always passing), agent anti-entropy and
``check_update_interval`` (output changes are visible at once, where a real
agent may defer output-only updates), the 30 s reaper cadence (reaping is
checked on every request), script/HTTP/TCP/gRPC checks, service/node
filtering expressions, ``near``, consistency modes, namespaces/partitions,
transactions, prepared queries, Connect, and ACL policies beyond one token.
"""

from __future__ import annotations

import asyncio
import base64
import json
import random
import re
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, Response
from starlette.routing import Route

__all__ = ["ConsulDouble", "ConsulState", "parse_duration"]

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


def _norm(body: dict[str, Any]) -> dict[str, Any]:
    """Case- and underscore-insensitive keys, as Consul's decoder accepts."""
    return {k.lower().replace("_", ""): v for k, v in body.items()}


class _HTTPError(Exception):
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
        b = _norm(body)
        name = b.get("name")
        if not name:
            raise _HTTPError(400, "Missing service name")
        sid = b.get("id") or name
        checks = b.get("checks") or ([b["check"]] if b.get("check") else [])
        if len(checks) > 1:
            raise _HTTPError(400, "consul double: one check per service is modelled")
        svc = self.services.get(sid)
        meta = b.get("meta")
        idx = self._touch_service(name)
        if svc is None:
            svc = _Service(sid, name, "", 0, [], None, create_index=idx)
            self.services[sid] = svc
        svc.name, svc.address, svc.port = name, b.get("address") or "", int(b.get("port") or 0)
        svc.tags, svc.meta, svc.modify_index = list(b.get("tags") or []), meta or None, idx
        if checks:
            c = _norm(checks[0])
            if not c.get("ttl"):
                raise _HTTPError(400, "consul double: only TTL checks are modelled")
            cid = c.get("checkid") or c.get("id") or f"service:{sid}"
            ttl = parse_duration(c["ttl"])
            dereg = c.get("deregistercriticalserviceafter")
            after = max(parse_duration(dereg), self.deregister_floor_s) if dereg else None
            status = c.get("status") or "critical"
            if status not in ("passing", "warning", "critical"):
                raise _HTTPError(400, f"Invalid Check Status: {status!r}")
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
                _norm(c).get("checkid") or _norm(c).get("id") or "" for c in checks
            }
            for cid in [x for x, chk in self.checks.items() if chk.service_id == sid]:
                if cid not in keep:
                    del self.checks[cid]

    def update_check(self, check_id: str, status: str, output: str, now: float) -> None:
        chk = self.checks.get(check_id)
        if chk is None:
            raise _HTTPError(
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
                raise _HTTPError(500, f'invalid session "{acquire}"')
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
        b = _norm(body)
        ttl_text = b.get("ttl") or ""
        ttl = parse_duration(ttl_text) if ttl_text else 0.0
        if ttl and not self.session_ttl_min_s <= ttl <= 86400:
            raise _HTTPError(
                500,
                f"Invalid Session TTL '{int(ttl * 1e9)}', must be between"
                f" [{self.session_ttl_min_s}s=24h0m0s]",
            )
        behavior = b.get("behavior") or "release"
        if behavior not in ("release", "delete"):
            raise _HTTPError(400, f"Invalid Behavior setting '{behavior}'")
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
            raise _HTTPError(404, f"Session id '{sid}' not found")
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


class ConsulDouble:
    """Build the ASGI app over a :class:`ConsulState` (which survives restarts)."""

    def __init__(self, state: ConsulState | None = None) -> None:
        self.state = state or ConsulState()

    def app(self) -> Starlette:
        return Starlette(
            routes=[
                Route("/v1/agent/service/register", self._register, methods=["PUT"]),
                Route("/v1/agent/service/deregister/{sid}", self._deregister, methods=["PUT"]),
                Route("/v1/agent/check/{verb}/{cid:path}", self._check, methods=["PUT"]),
                Route("/v1/health/service/{name}", self._health, methods=["GET"]),
                Route("/v1/kv/{key:path}", self._kv, methods=["GET", "PUT", "DELETE"]),
                Route("/v1/session/{verb}/{sid:path}", self._session, methods=["GET", "PUT"]),
                Route("/v1/session/create", self._session_create, methods=["PUT"]),
                Route("/v1/status/leader", self._leader, methods=["GET"]),
            ]
        )

    # -- request plumbing ---------------------------------------------------

    async def _guard(
        self, request: Request, fn: Callable[[float], Response], *, needs_leader: bool = True
    ) -> Response:
        st = self.state
        st.requests += 1
        token = request.headers.get("x-consul-token") or request.query_params.get("token")
        if st.acl_token is not None and token != st.acl_token:
            return PlainTextResponse("ACL not found", status_code=403)
        if needs_leader and not st.leader:
            return PlainTextResponse(
                "No cluster leader", status_code=500, headers={"X-Consul-KnownLeader": "false"}
            )
        try:
            with st.lock:
                now = time.monotonic()
                st.advance(now)
                return fn(now)
        except _HTTPError as exc:
            return PlainTextResponse(exc.text, status_code=exc.status)
        except (ValueError, KeyError, TypeError) as exc:
            return PlainTextResponse(f"Request decode failed: {exc}", status_code=400)

    async def _blocking(
        self, request: Request, read: Callable[[], tuple[int, Any]]
    ) -> tuple[int, Any] | Response:
        q = request.query_params
        try:
            min_index = int(q.get("index") or 0)
            wait = min(parse_duration(q["wait"]) if "wait" in q else 300.0, 600.0)
        except ValueError as exc:
            return PlainTextResponse(f"Invalid blocking query: {exc}", status_code=400)
        deadline = time.monotonic() + wait + random.uniform(0, wait / 16)
        snapshot: list[tuple[int, Any]] = []

        def take(now: float) -> Response:
            snapshot.append(read())
            return Response()

        while True:
            snapshot.clear()
            failed = await self._guard(request, take)
            if not snapshot:
                return failed
            idx, data = snapshot[0]
            idx = max(idx, 1)
            if min_index == 0 or idx > min_index or time.monotonic() >= deadline:
                return idx, data
            await asyncio.sleep(0.02)

    @staticmethod
    def _json(data: Any, index: int, status: int = 200) -> Response:
        return JSONResponse(
            data,
            status_code=status,
            headers={"X-Consul-Index": str(index), "X-Consul-KnownLeader": "true",
                     "X-Consul-LastContact": "0"},
        )  # fmt: skip

    # -- handlers -----------------------------------------------------------

    async def _register(self, request: Request) -> Response:
        body = json.loads(await request.body() or b"{}")
        if request.query_params.get("replace-existing-checks"):
            body["ReplaceExistingChecks"] = True

        def op(now: float) -> Response:
            self.state.register(body, now)
            return Response(status_code=200)

        return await self._guard(request, op, needs_leader=False)

    async def _deregister(self, request: Request) -> Response:
        sid = request.path_params["sid"]

        def op(now: float) -> Response:
            if not self.state.remove_service(sid):
                raise _HTTPError(
                    404,
                    f'Unknown service ID "{sid}". Ensure that the service ID is passed,'
                    " not the service name.",
                )
            return Response(status_code=200)

        return await self._guard(request, op, needs_leader=False)

    async def _check(self, request: Request) -> Response:
        verb, cid = request.path_params["verb"], request.path_params["cid"]
        statuses = {"pass": "passing", "warn": "warning", "fail": "critical"}
        if verb == "update":
            body = _norm(json.loads(await request.body() or b"{}"))
            status, output = body.get("status") or "", body.get("output") or ""
        elif verb in statuses:
            status, output = statuses[verb], request.query_params.get("note", "")
        else:
            return PlainTextResponse("Not Found", status_code=404)

        def op(now: float) -> Response:
            if status not in ("passing", "warning", "critical"):
                raise _HTTPError(400, f"Invalid check status: {status!r}")
            self.state.update_check(cid, status, output, now)
            return Response(status_code=200)

        return await self._guard(request, op, needs_leader=False)

    async def _health(self, request: Request) -> Response:
        name = request.path_params["name"]
        passing = "passing" in request.query_params
        got = await self._blocking(request, lambda: self.state.health_service(name, passing))
        if isinstance(got, Response):
            return got
        return self._json(got[1], got[0])

    async def _kv(self, request: Request) -> Response:
        key = request.path_params["key"]
        q = request.query_params
        if request.method == "GET":
            recurse = "recurse" in q
            got = await self._blocking(request, lambda: self.state.kv_read(key, recurse))
            if isinstance(got, Response):
                return got
            idx, entries = got
            if not entries:
                headers = {"X-Consul-Index": str(idx), "X-Consul-KnownLeader": "true"}
                return Response(status_code=404, headers=headers)
            if "keys" in q:
                return self._json([e.key for e in entries], idx)
            return self._json([self.state.kv_json(e) for e in entries], idx)
        if request.method == "PUT":
            body = await request.body()
            params = dict(q)

            def put(now: float) -> Response:
                ok = self.state.kv_put(key, body or None, params, now)
                return self._json(ok, self.state.index)

            return await self._guard(request, put)

        def delete(now: float) -> Response:
            cas = int(q["cas"]) if "cas" in q else None
            return self._json(self.state.kv_delete(key, "recurse" in q, cas), self.state.index)

        return await self._guard(request, delete)

    async def _session_create(self, request: Request) -> Response:
        raw = await request.body()
        body = json.loads(raw) if raw else {}

        def op(now: float) -> Response:
            return self._json({"ID": self.state.session_create(body, now)}, self.state.index)

        return await self._guard(request, op)

    async def _session(self, request: Request) -> Response:
        verb, sid = request.path_params["verb"], request.path_params["sid"]
        st = self.state

        def op(now: float) -> Response:
            if verb == "renew" and request.method == "PUT":
                return self._json([st.session_renew(sid, now)], st.index)
            if verb == "destroy" and request.method == "PUT":
                st.invalidate(sid, now)
                return self._json(True, st.index)
            if verb == "info" and request.method == "GET":
                sess = st.sessions.get(sid)
                return self._json([st.session_json(sess)] if sess else [], st.index)
            raise _HTTPError(405, "method not allowed")

        return await self._guard(request, op)

    async def _leader(self, request: Request) -> Response:
        return JSONResponse("127.0.0.1:8300" if self.state.leader else "")
