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
import json
import random
import time
from collections.abc import Callable
from typing import Any

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, Response
from starlette.routing import Route

from tests.registry.consul_state import ConsulState, HTTPError, norm, parse_duration

__all__ = ["ConsulDouble", "ConsulState"]


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
        except HTTPError as exc:
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
                raise HTTPError(
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
            body = norm(json.loads(await request.body() or b"{}"))
            status, output = body.get("status") or "", body.get("output") or ""
        elif verb in statuses:
            status, output = statuses[verb], request.query_params.get("note", "")
        else:
            return PlainTextResponse("Not Found", status_code=404)

        def op(now: float) -> Response:
            if status not in ("passing", "warning", "critical"):
                raise HTTPError(400, f"Invalid check status: {status!r}")
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
            raise HTTPError(405, "method not allowed")

        return await self._guard(request, op)

    async def _leader(self, request: Request) -> Response:
        return JSONResponse("127.0.0.1:8300" if self.state.leader else "")
