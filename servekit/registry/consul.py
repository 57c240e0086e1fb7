"""The Consul registry backend, through the real ``py-consul`` client.

Mapping onto Consul:

* an instance is a service instance (``ID`` = instance id, ``Service`` =
  ``service_name``) whose identity rides in ``Meta`` (checked against
  Consul's rules first: :func:`~servekit.registry.codec.check_meta`) and
  whose one TTL check ``service:<id>`` says whether it is alive and ready.
  It registers ``warning`` (alive, not yet ready); a heartbeat is
  ``/v1/agent/check/pass`` when the load report says ready and
  ``/v1/agent/check/warn`` when not (loading, draining), with the report as
  the note. A Consul agent syncs a status change to the servers at once and
  an output-only change only after ``check_update_interval`` (see
  :mod:`~servekit.registry.consul_agent_check`), so readiness and draining
  reach readers within a blocking query, figures late; routers read figures
  from each instance's ``/load``. ``DeregisterCriticalServiceAfter`` reaps
  instances that stopped beating (Consul floors it at 1m);
* heartbeats must reach the agent that holds the instance: a 404 for a check
  that the catalog shows alive on another node raises :class:`WrongAgent`
  instead of registering a second copy there;
* discovery is ``GET /v1/health/service/<name>`` (all entries; health is
  judged here, :mod:`~servekit.registry.consul_health`) as a blocking query
  (``index`` + ``wait``); an index that goes backwards resets the watch, and
  back-to-back watches are spaced by ``min_watch_interval_s``. A listing
  that ACLs filtered (``X-Consul-Results-Filtered-By-ACLs``) raises
  :class:`AccessFiltered` rather than passing for the whole fleet;
* KV maps 1:1 (``cas`` for put-if); ``datacenter`` applies to health, KV and
  session calls, never to agent endpoints;
* a lock is a session (``TTL``, ``Behavior=release``, ``LockDelay=0s``) that
  holds the key through ``?acquire=``; renew is ``/v1/session/renew``. Consul
  may keep a session up to twice its TTL before invalidating it.

``py-consul``'s client is synchronous (its async flavour needs aiohttp), so
calls run on a small private thread pool: blocking queries hold a thread for
their ``wait`` and must not starve the default executor. Foreign exceptions
become registry errors in one place, :meth:`ConsulRegistry._call`.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from functools import partial
from typing import Any, TypeVar

import consul
import requests
from consul.callback import CB
from consul.exceptions import BadRequest, ClientError

from servekit.durations import go_duration
from servekit.engine.protocol import LoadReport
from servekit.registry.codec import check_meta, info_to_meta, load_to_json
from servekit.registry.consul_agent_check import agent_facts, judge_agent
from servekit.registry.consul_conn import ConsulConnection, resolve_connection
from servekit.registry.consul_health import Listing, check_id, read_listing
from servekit.registry.protocol import (
    AccessFiltered,
    InstanceInfo,
    InstanceState,
    KVEntry,
    LockHandle,
    NotRegistered,
    RegistryError,
    RegistryRejected,
    RegistryUnavailable,
    Tier,
    WrongAgent,
)
from servekit.registry.settings import ConsulSettings

__all__ = ["ConsulConnection", "ConsulRegistry", "resolve_connection"]

log = logging.getLogger(__name__)
_FILTERED = "X-Consul-Results-Filtered-By-ACLs"

_T = TypeVar("_T")


class _NotFound(RegistryError):
    """Consul answered 404 where the caller treats absence as a result."""


class ConsulRegistry:
    """:class:`~servekit.registry.protocol.Registry` backed by a Consul agent."""

    def __init__(self, settings: ConsulSettings, environ: Mapping[str, str] | None = None) -> None:
        self.settings = settings
        self.connection = resolve_connection(settings, environ)
        conn = self.connection
        self._client: Any = consul.Consul(
            host=conn.host,
            port=conn.port,
            token=conn.token,
            scheme=conn.scheme,
            dc=settings.datacenter,
            verify=conn.verify,
            cert=conn.cert,
            connections_timeout=settings.request_timeout_s,
        )
        # py-consul lets $CONSUL_HTTP_TOKEN override an explicit token; ours won.
        self._client.token = conn.token
        self._pool = ThreadPoolExecutor(max_workers=16, thread_name_prefix="consul")
        self._last_watch: dict[str, float] = {}
        self._closed = False
        self._agent_check: asyncio.Task[list[str]] | None = None
        self._duplicates_logged: set[tuple[str, ...]] = set()

    # -- plumbing ---------------------------------------------------------

    async def _call(self, fn: Callable[..., _T], *args: Any, **kwargs: Any) -> _T:
        """Run one py-consul call off the loop; the one place its (and
        requests') exceptions are translated."""
        if self._closed:
            raise RegistryUnavailable("consul registry is closed")
        loop = asyncio.get_running_loop()
        try:
            return await loop.run_in_executor(self._pool, partial(fn, *args, **kwargs))
        except consul.NotFound as exc:
            raise _NotFound(str(exc)) from exc
        except (consul.ACLPermissionDenied, consul.ACLDisabled) as exc:
            raise RegistryError(f"consul refused the ACL token: {exc}") from exc
        except BadRequest as exc:
            raise RegistryRejected(f"consul rejected the request: {exc}") from exc
        except ClientError as exc:
            raise RegistryError(f"consul rejected the request: {exc}") from exc
        except (consul.ConsulException, requests.RequestException) as exc:
            # 5xx (no leader, rpc errors), timeouts, refused connections.
            raise RegistryUnavailable(f"consul at {self._where}: {exc}") from exc

    @property
    def _where(self) -> str:
        return f"{self.connection.scheme}://{self.connection.host}:{self.connection.port}"

    async def _paced(self, what: str) -> None:
        """Space back-to-back blocking queries so a churning index cannot spin us."""
        last = self._last_watch.get(what)
        if last is not None:
            wait = self.settings.min_watch_interval_s - (time.monotonic() - last)
            if wait > 0:
                await asyncio.sleep(wait)

    def _get(
        self, path: str, params: list[tuple[str, str]], *, what: str, decode: str | None = None
    ) -> tuple[str, Any]:
        """A GET through py-consul's session that also refuses an ACL-filtered answer
        (py-consul's readers drop that header). Runs in the pool, under ``_call``."""
        if self.settings.datacenter:
            params = [*params, ("dc", self.settings.datacenter)]
        parse = CB.json(index=True, decode=decode or False)

        def callback(response: Any) -> tuple[str, Any]:
            result: tuple[str, Any] = parse(response)
            if response.headers.get(_FILTERED) == "true":
                raise AccessFiltered(
                    f"consul ACLs hid part of {what}: the token lacks read rights (a reader"
                    f" of service {self.settings.service_name!r} needs service:read and"
                    " node:read; KV readers need key_prefix read)"
                )
            return result

        got: tuple[str, Any] = self._client.http.get(
            callback, path, params=params, headers=self._client.prepare_headers()
        )
        return got

    def start_agent_check(self) -> None:
        """Inspect the agent's settings once in the background (logs warnings)."""
        if self._agent_check is None:
            self._agent_check = asyncio.create_task(self.check_agent(), name="consul-agent-check")

    async def check_agent(self) -> list[str]:
        """Read ``/v1/agent/self`` and log what its settings mean for the fleet;
        returns the warnings (empty when the agent cannot be asked)."""
        try:
            body = await self._call(self._client.agent.self)
        except RegistryError as exc:
            log.info("consul agent settings not checked (%s)", exc)
            return []
        facts = agent_facts(body or {})
        warnings = judge_agent(facts, self.settings.datacenter)
        for warning in warnings:
            log.warning("%s", warning)
        verdict = f"{len(warnings)} warnings" if warnings else "settings as the fleet expects"
        log.info("consul agent %s in datacenter %s: %s", facts.node, facts.datacenter, verdict)
        return warnings

    async def aclose(self) -> None:
        if self._closed:
            return
        self._closed = True
        if self._agent_check is not None:
            self._agent_check.cancel()
            await asyncio.gather(self._agent_check, return_exceptions=True)
        self._pool.shutdown(wait=False, cancel_futures=True)
        # Abort blocking queries still parked in the pool.
        self._client.http.session.close()

    # -- catalog ----------------------------------------------------------

    async def register(self, info: InstanceInfo, ttl_s: float) -> None:
        check_meta(info)
        check = {
            "CheckID": check_id(info.id),
            "Name": "load heartbeat",
            "TTL": go_duration(ttl_s),
            "DeregisterCriticalServiceAfter": go_duration(
                self.settings.deregister_critical_after_s
            ),
            # Alive, not serving yet: the first ready beat is a status change,
            # which the agent syncs at once (a check definition has no Output).
            "Status": "warning",
        }
        ok = await self._call(
            self._client.agent.service.register,
            self.settings.service_name,
            service_id=info.id,
            address=info.address,
            port=info.port,
            tags=list(info.tags),
            meta=info_to_meta(info),
            check=check,
            replace_existing_checks=True,
        )
        if not ok:
            raise RegistryError(f"consul did not register {info.id}")

    async def heartbeat(self, instance_id: str, load: LoadReport) -> None:
        beat = (
            self._client.agent.check.ttl_pass if load.ready else self._client.agent.check.ttl_warn
        )
        note = load_to_json(load, sent_at=time.time())
        if await self._call(beat, check_id(instance_id), notes=note):
            return
        # 404 Unknown check ID: this agent does not hold it. Reaped, or the
        # beat reached another node's agent (a load balancer in front of agents).
        listing = await self._listing()
        holders = [s for s in listing.states if s.info.id == instance_id and s.healthy]
        if holders:
            nodes = listing.nodes.get(instance_id) or ["another node"]
            raise WrongAgent(
                f"heartbeat for {instance_id} reached a consul agent that does not hold it,"
                f" while it is registered and alive on {', '.join(nodes)}: point"
                f" registry.consul.address at the agent on the instance's own host (not a load"
                f" balancer or a server), now {self._where}"
            )
        raise NotRegistered(instance_id)

    async def deregister(self, instance_id: str) -> None:
        await self._call(self._client.agent.service.deregister, instance_id)

    async def instances(
        self, *, tier: Tier | None = None, region: str | None = None, healthy_only: bool = True
    ) -> list[InstanceState]:
        listing = await self._listing()
        return [
            s
            for s in listing.states
            if (tier is None or s.info.tier == tier)
            and (region is None or s.info.region == region)
            and (s.healthy or not healthy_only)
        ]

    async def watch_instances(
        self, index: int, timeout_s: float
    ) -> tuple[int, list[InstanceState]]:
        await self._paced("catalog")
        try:
            new_index, listing = await self._listing_at(index, timeout_s)
            if new_index < index:  # the index went backwards: start over
                new_index, listing = await self._listing_at(0, timeout_s)
        finally:
            self._last_watch["catalog"] = time.monotonic()
        return max(new_index, 1), [s for s in listing.states if s.healthy]

    async def _listing(self) -> Listing:
        return (await self._listing_at(0, 0.0))[1]

    async def _listing_at(self, index: int, wait_s: float) -> tuple[int, Listing]:
        params = [("index", str(index)), ("wait", go_duration(wait_s))] if index else []
        name = self.settings.service_name
        raw_index, entries = await self._call(
            self._get, f"/v1/health/service/{name}", params, what=f"the instances of {name!r}"
        )
        listing = read_listing(entries)
        for iid, nodes in listing.duplicates.items():
            key = (iid, *nodes)
            if key not in self._duplicates_logged:
                self._duplicates_logged.add(key)
                log.warning("instance %s is registered on several consul nodes (%s); using the"
                            " live copy", iid, ", ".join(nodes))  # fmt: skip
        return int(raw_index), listing

    # -- KV ---------------------------------------------------------------

    async def get(self, key: str) -> KVEntry | None:
        _, item = await self._call(self._client.kv.get, key)
        return _entry(item) if item else None

    async def put(self, key: str, value: bytes) -> None:
        if not await self._call(self._client.kv.put, key, bytes(value)):
            raise RegistryError(f"consul refused to write {key!r}")

    async def put_if(self, key: str, value: bytes, modify_index: int) -> bool:
        return bool(await self._call(self._client.kv.put, key, bytes(value), cas=modify_index))

    async def delete(self, key: str) -> None:
        await self._call(self._client.kv.delete, key)

    async def list_prefix(self, prefix: str) -> list[KVEntry]:
        _, items = await self._kv_list(prefix, 0, 0.0)
        return [_entry(i) for i in items or []]

    async def _kv_list(self, prefix: str, index: int, wait_s: float) -> tuple[str, Any]:
        params = [("recurse", "1")]
        if index:
            params += [("index", str(index)), ("wait", go_duration(wait_s))]
        got: tuple[str, Any] = await self._call(
            self._get, f"/v1/kv/{prefix}", params, what=f"KV under {prefix!r}", decode="Value"
        )
        return got

    async def watch_prefix(
        self, prefix: str, index: int, timeout_s: float
    ) -> tuple[int, list[KVEntry]]:
        await self._paced("kv:" + prefix)
        try:
            new, items = await self._kv_list(prefix, index, timeout_s)
            new_index = int(new)
            if new_index < index:
                new, items = await self._kv_list(prefix, 0, 0.0)
                new_index = int(new)
        finally:
            self._last_watch["kv:" + prefix] = time.monotonic()
        return max(new_index, 1), [_entry(i) for i in items or []]

    # -- locks ------------------------------------------------------------

    async def acquire_lock(self, key: str, holder: str, ttl_s: float) -> LockHandle | None:
        session = await self._call(self._create_session, holder, ttl_s)
        value = json.dumps({"holder": holder}).encode()
        try:
            held = await self._call(self._client.kv.put, key, value, acquire=session)
        except BaseException:
            await self._destroy_quietly(session)
            raise
        if not held:
            await self._destroy_quietly(session)
            return None
        return LockHandle(key=key, holder=holder, session=session, ttl_s=ttl_s)

    def _create_session(self, holder: str, ttl_s: float) -> str:
        # py-consul's session.create() insists on a whole TTL >= 10s; the
        # servers' own floor is their session_ttl_min, so send the body ourselves.
        body = {
            "Name": holder,
            "TTL": go_duration(ttl_s),
            "Behavior": "release",
            "LockDelay": "0s",
        }
        params = [("dc", self.settings.datacenter)] if self.settings.datacenter else []
        try:
            sid: str = self._client.http.put(
                CB.json(is_id=True),
                "/v1/session/create",
                params=params,
                headers=self._client.prepare_headers(),
                data=json.dumps(body),
            )
        except consul.ConsulException as exc:
            # Consul answers a TTL outside [session_ttl_min, 24h] with a 500
            # (agent/consul/session_endpoint.go); it is the caller's mistake.
            if "Invalid Session TTL" in str(exc):
                raise RegistryRejected(
                    f"lock TTL {ttl_s:g}s refused: {exc} (Consul's session_ttl_min is 10s"
                    " unless the servers lower it)"
                ) from exc
            raise
        return sid

    async def renew_lock(self, lock: LockHandle) -> bool:
        try:
            await self._call(self._client.session.renew, lock.session)
        except _NotFound:
            return False
        _, item = await self._call(self._client.kv.get, lock.key)
        return bool(item) and item.get("Session") == lock.session

    async def release_lock(self, lock: LockHandle) -> None:
        value = json.dumps({"holder": lock.holder}).encode()
        try:
            await self._call(self._client.kv.put, lock.key, value, release=lock.session)
        finally:
            await self._destroy_quietly(lock.session)

    async def _destroy_quietly(self, session: str) -> None:
        with contextlib.suppress(RegistryError):  # it expires on its TTL anyway
            await self._call(self._client.session.destroy, session)


def _entry(item: Mapping[str, Any]) -> KVEntry:
    return KVEntry(
        key=item["Key"],
        value=item.get("Value") or b"",
        modify_index=int(item["ModifyIndex"]),
        create_index=int(item.get("CreateIndex") or 0),
        session=item.get("Session") or None,
    )
