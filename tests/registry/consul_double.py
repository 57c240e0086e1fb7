"""An HTTP double of a Consul agent's API, served on a real socket.

Each :class:`ConsulDouble` is one *agent* (:mod:`tests.registry.consul_agent`:
its node, its local services and checks, their TTLs and the agent's deferred
sync) in one *datacenter* (:mod:`tests.registry.consul_state`: the servers'
catalog, KV, sessions and indexes). Several doubles over one
:class:`ConsulState` are several nodes of a datacenter; :func:`federate`
WAN-joins datacenters. It speaks the endpoints the registry's Consul backend
(through ``py-consul``) uses, with Consul's JSON bodies (PascalCase fields,
base64 ``Value`` or ``null``, ``null`` service ``Meta`` when none was
registered, ``Flags``, ``LockIndex``, ``Session`` only while held), status
codes and texts (404 ``Unknown check ID`` for a beat on a check this agent
does not hold, 400 ``Invalid Service Meta: ...``, 400 ``Request decode
failed: json: unknown field ...``, ``true``/``false`` bodies for KV writes)
and headers (``X-Consul-Index``, ``X-Consul-KnownLeader``,
``X-Consul-LastContact``, ``X-Consul-Results-Filtered-By-ACLs``).

Modelled, from Consul's source (file names are Consul's):

* agent endpoints are local to the agent and ignore ``?dc=``; health, KV and
  session endpoints go to the datacenter named by ``?dc=`` (500 ``No path to
  datacenter`` for an unknown one);
* the agent's sync (``agent/local/state.go``): status changes at once,
  output-only changes after ``check_update_interval`` (default 5m) /2 plus a
  random stagger, check state kept across re-registration, TTL expiry,
  ``DeregisterCriticalServiceAfter`` floored at 1m and reaped every 30s
  (``agent/agent.go``, ``agent/config/default.go``); all configurable through
  :class:`AgentConfig`, defaulting to Consul's;
* registration validation: unknown fields, meta (``ValidateServiceMetadata``),
  check status, the any-address;
* ``/v1/health/service/<name>`` with ``passing`` filters on all checks,
  including the node's ``serfHealth``; the index is per service name;
* blocking queries: ``index`` + ``wait`` (default 5m, max 10m, plus up to
  wait/16 jitter), returning as soon as the index passes the client's; an
  index above the server's blocks for the full wait;
* KV: ``cas`` (0 = create only), ``flags``, ``recurse``, ``keys``,
  ``acquire``/``release`` with ``LockIndex``, lock-delay, and a list index
  that counts deletes through tombstones;
* sessions: ``TTL`` bounded by ``session_ttl_min`` (10 s by default) and 24h,
  invalidated after twice the TTL without renew, ``Behavior`` release/delete,
  ``LockDelay`` (numbers below 1000 read as seconds, as Consul does);
* ACLs (:mod:`tests.registry.consul_acl`): unknown tokens 403, writes without
  rights 403, listings filtered with the header;
* ``/v1/agent/self`` with the runtime config fields clients inspect;
  ``leader=False`` answers ``500 No cluster leader`` on server endpoints.

Not modelled: gossip and node failure (``serfHealth`` is always passing),
script/HTTP/TCP/gRPC checks, filtering expressions, ``near``, consistency
modes, namespaces/partitions, transactions, prepared queries, Connect, and
prefix-scoped ACL rules (a right covers every name).
"""

from __future__ import annotations

import asyncio
import json
import random
import time
from collections.abc import Callable
from typing import Any

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, Response
from starlette.routing import Route

from tests.registry.consul_acl import FILTERED_HEADER, AclDenied, Rights
from tests.registry.consul_agent import AgentConfig, ConsulAgent
from tests.registry.consul_state import (
    ConsulState,
    HTTPError,
    federate,
    norm,
    parse_duration,
)

__all__ = ["AgentConfig", "ConsulAgent", "ConsulDouble", "ConsulState", "federate"]

_Op = Callable[[float, Rights], Response]


class ConsulDouble:
    """The ASGI app of one agent; the agent and its datacenter survive restarts
    of the HTTP server (pass the same ones again)."""

    def __init__(self, state: ConsulState | None = None, agent: ConsulAgent | None = None) -> None:
        self.state = agent.dc if agent is not None else state or ConsulState()
        self.agent = agent or self.state.default_agent()

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
                Route("/v1/agent/self", self._self, methods=["GET"]),
            ]
        )

    # -- request plumbing ---------------------------------------------------

    async def _guard(
        self, request: Request, fn: _Op, *, needs_leader: bool = True, local: bool = False
    ) -> Response:
        """Run ``fn(now, rights)`` under the datacenter's lock (``local``: an agent
        endpoint, which ignores ``?dc=`` and needs no leader)."""
        st = self.state
        st.requests += 1
        token = request.headers.get("x-consul-token") or request.query_params.get("token") or ""
        try:
            with st.lock:
                rights = st.rights(token)
                target = st if local else st.route(request.query_params.get("dc"))
                if needs_leader and not local and not target.leader:
                    return PlainTextResponse(
                        "No cluster leader", status_code=500,
                        headers={"X-Consul-KnownLeader": "false"},
                    )  # fmt: skip
                now = st.clock()
                for dc in {id(d): d for d in st.wan.values()}.values():
                    dc.advance(now)
                return fn(now, rights)
        except AclDenied as exc:
            return PlainTextResponse(exc.text, status_code=403)
        except HTTPError as exc:
            return PlainTextResponse(exc.text, status_code=exc.status)
        except (ValueError, KeyError, TypeError) as exc:
            return PlainTextResponse(f"Request decode failed: {exc}", status_code=400)

    def _target(self, request: Request) -> ConsulState:
        return self.state.route(request.query_params.get("dc"))

    async def _blocking(
        self, request: Request, read: Callable[[Rights], tuple[int, Any, bool]]
    ) -> tuple[int, Any, bool] | Response:
        """Wait for ``read(rights)`` (index, data, filtered-by-ACLs) to pass ``index``."""
        q = request.query_params
        try:
            min_index = int(q.get("index") or 0)
            wait = min(parse_duration(q["wait"]) if "wait" in q else 300.0, 600.0)
        except ValueError as exc:
            return PlainTextResponse(f"Invalid blocking query: {exc}", status_code=400)
        deadline = time.monotonic() + wait + random.uniform(0, wait / 16)
        snapshot: list[tuple[int, Any, bool]] = []

        def take(now: float, rights: Rights) -> Response:
            idx, data, hidden = read(rights)
            snapshot.append((idx, data, hidden and not rights.anonymous))
            return Response()

        while True:
            snapshot.clear()
            failed = await self._guard(request, take)
            if not snapshot:
                return failed
            idx, data, hidden = snapshot[0]
            idx = max(idx, 1)
            if min_index == 0 or idx > min_index or time.monotonic() >= deadline:
                return idx, data, hidden
            await asyncio.sleep(0.02)

    @staticmethod
    def _json(data: Any, index: int, status: int = 200, filtered: bool = False) -> Response:
        headers = {"X-Consul-Index": str(index), "X-Consul-KnownLeader": "true",
                   "X-Consul-LastContact": "0"}  # fmt: skip
        if filtered:  # set only for a presented token (maskResultsFilteredByACLs)
            headers[FILTERED_HEADER] = "true"
        return JSONResponse(data, status_code=status, headers=headers)

    # -- handlers -----------------------------------------------------------

    async def _register(self, request: Request) -> Response:
        body = json.loads(await request.body() or b"{}")
        replace = bool(request.query_params.get("replace-existing-checks"))

        def op(now: float, rights: Rights) -> Response:
            rights.require("service", "write", str(norm(body).get("name", "")))
            self.agent.register(body, now, replace)
            return Response(status_code=200)

        return await self._guard(request, op, local=True)

    async def _deregister(self, request: Request) -> Response:
        sid = request.path_params["sid"]

        def op(now: float, rights: Rights) -> Response:
            rights.require("service", "write", sid)
            if not self.agent.deregister(sid):
                raise HTTPError(
                    404,
                    f'Unknown service ID "{sid}". Ensure that the service ID is passed,'
                    " not the service name.",
                )
            return Response(status_code=200)

        return await self._guard(request, op, local=True)

    async def _check(self, request: Request) -> Response:
        verb, cid = request.path_params["verb"], request.path_params["cid"]
        statuses = {"pass": "passing", "warn": "warning", "fail": "critical"}
        if verb == "update":
            body = norm(json.loads(await request.body() or b"{}"))
            status, output = body.get("status") or "", body.get("output") or ""
        elif verb in statuses:
            status, output = statuses[verb], request.query_params.get("note", "")
        else:
            return PlainTextResponse("Not Found", status_code=404)

        def op(now: float, rights: Rights) -> Response:
            if status not in ("passing", "warning", "critical"):
                raise HTTPError(400, f"Invalid check status: {status!r}")
            rights.require("service", "write", cid)
            self.agent.update_check(cid, status, output, now)
            return Response(status_code=200)

        return await self._guard(request, op, local=True)

    async def _self(self, request: Request) -> Response:
        def op(now: float, rights: Rights) -> Response:
            rights.require("agent", "read", self.agent.node)
            return JSONResponse(self.agent.self_json())

        return await self._guard(request, op, local=True)

    async def _health(self, request: Request) -> Response:
        name = request.path_params["name"]
        passing = "passing" in request.query_params
        target = self.state

        def read(rights: Rights) -> tuple[int, Any, bool]:
            return target.route(request.query_params.get("dc")).health_service(
                name, passing, rights
            )

        got = await self._blocking(request, read)
        if isinstance(got, Response):
            return got
        return self._json(got[1], got[0], filtered=got[2])

    async def _kv(self, request: Request) -> Response:
        key = request.path_params["key"]
        q = request.query_params
        if request.method == "GET":
            recurse = "recurse" in q

            def read(rights: Rights) -> tuple[int, Any, bool]:
                dc = self._target(request)
                idx, entries = dc.kv_read(key, recurse)
                if rights.allows("key"):
                    return idx, entries, False
                if not recurse:  # KVS.Get denies; KVS.List filters
                    rights.require("key", "read", key)
                return idx, [], bool(entries)

            got = await self._blocking(request, read)
            if isinstance(got, Response):
                return got
            idx, entries, hidden = got
            if not entries:
                headers = {"X-Consul-Index": str(idx), "X-Consul-KnownLeader": "true"}
                if hidden:
                    headers[FILTERED_HEADER] = "true"
                return Response(status_code=404, headers=headers)
            if "keys" in q:
                return self._json([e.key for e in entries], idx)
            return self._json([ConsulState.kv_json(e) for e in entries], idx)
        if request.method == "PUT":
            body = await request.body()
            params = dict(q)

            def put(now: float, rights: Rights) -> Response:
                rights.require("key", "write", key)
                dc = self._target(request)
                ok = dc.kv_put(key, body or None, params, now)
                return self._json(ok, dc.index)

            return await self._guard(request, put)

        def delete(now: float, rights: Rights) -> Response:
            rights.require("key", "write", key)
            dc = self._target(request)
            cas = int(q["cas"]) if "cas" in q else None
            return self._json(dc.kv_delete(key, "recurse" in q, cas), dc.index)

        return await self._guard(request, delete)

    async def _session_create(self, request: Request) -> Response:
        raw = await request.body()
        body = json.loads(raw) if raw else {}

        def op(now: float, rights: Rights) -> Response:
            rights.require("session", "write", self.agent.node)
            dc = self._target(request)
            return self._json({"ID": dc.session_create(body, now, self.agent.node)}, dc.index)

        return await self._guard(request, op)

    async def _session(self, request: Request) -> Response:
        verb, sid = request.path_params["verb"], request.path_params["sid"]

        def op(now: float, rights: Rights) -> Response:
            st = self._target(request)
            rights.require("session", "read" if verb == "info" else "write", sid)
            if verb == "renew" and request.method == "PUT":
                return self._json([st.session_renew(sid, now)], st.index)
            if verb == "destroy" and request.method == "PUT":
                st.invalidate(sid, now)
                return self._json(True, st.index)
            if verb == "info" and request.method == "GET":
                sess = st.sessions.get(sid)
                return self._json([st.session_json(sess)] if sess else [], st.index)
            raise HTTPError(405, "method not allowed")

        return await self._guard(request, op)

    async def _leader(self, request: Request) -> Response:
        return JSONResponse("127.0.0.1:8300" if self.state.leader else "")
