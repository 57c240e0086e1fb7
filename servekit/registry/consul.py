"""The Consul registry backend, through the real ``py-consul`` client.

Mapping onto Consul:

* an instance is a service instance (``ID`` = instance id, ``Service`` =
  ``service_name``) whose identity rides in ``Meta`` and whose single TTL
  check ``service:<id>`` carries the load: a heartbeat is
  ``PUT /v1/agent/check/pass/service:<id>?note=<load JSON>`` (Consul puts the
  note in the check's ``Output``). ``DeregisterCriticalServiceAfter`` reaps
  instances that stopped beating. Note that a Consul agent syncs output-only
  check changes to the servers at most every ``check_update_interval``
  (default 5m): set it low (e.g. ``"1s"``) on agents that host instances, or
  readers see load reports late;
* discovery is ``GET /v1/health/service/<name>?passing`` as a blocking query
  (``index`` + ``wait``); an index that goes backwards resets the watch, and
  back-to-back watches are spaced by ``min_watch_interval_s``;
* KV maps 1:1 (``cas`` for put-if);
* a lock is a session (``TTL``, ``Behavior=release``, ``LockDelay=0s``) that
  holds the key through ``?acquire=``; renew is ``/v1/session/renew``. Consul
  may keep a session up to twice its TTL before invalidating it.

``py-consul``'s client is synchronous (its async flavour needs aiohttp), so
calls run on a small private thread pool: blocking queries hold a thread for
their ``wait`` and must not starve the default executor. Foreign exceptions
become :class:`RegistryUnavailable` / :class:`RegistryError` in one place,
:meth:`ConsulRegistry._call`.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import time
import urllib.parse
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any, TypeVar

import consul
import requests
from consul.callback import CB
from consul.exceptions import BadRequest, ClientError

from servekit.engine.protocol import LoadReport
from servekit.registry.codec import info_from_meta, info_to_meta, load_from_json, load_to_json
from servekit.registry.codec import sent_at_from_json as _sent_at
from servekit.registry.protocol import (
    InstanceInfo,
    InstanceState,
    KVEntry,
    LockHandle,
    NotRegistered,
    RegistryError,
    RegistryUnavailable,
    Tier,
)
from servekit.registry.settings import ConsulSettings

__all__ = ["ConsulConnection", "ConsulRegistry", "resolve_connection"]

_T = TypeVar("_T")


class _NotFound(RegistryError):
    """Consul answered 404 where the caller treats absence as a result."""


@dataclass(frozen=True, slots=True)
class ConsulConnection:
    """Where and how to reach the agent, after settings and environment."""

    host: str
    port: int
    scheme: str
    token: str | None
    verify: bool | str
    cert: tuple[str, str] | str | None


def resolve_connection(
    settings: ConsulSettings, environ: Mapping[str, str] | None = None
) -> ConsulConnection:
    """Settings first, then the ``CONSUL_*`` environment variables, then defaults.

    The ACL token: ``consul.token`` (or ``token_file`` / ``token_env``), then
    ``$CONSUL_HTTP_TOKEN``, then the file ``$CONSUL_HTTP_TOKEN_FILE`` names.
    """
    env = os.environ if environ is None else environ
    address = settings.address or env.get("CONSUL_HTTP_ADDR") or "127.0.0.1:8500"
    parsed = urllib.parse.urlparse(address if "//" in address else "//" + address)
    try:
        port = parsed.port
    except ValueError as exc:
        raise RegistryError(f"invalid Consul address {address!r}: {exc}") from None
    ssl_env = env.get("CONSUL_HTTP_SSL", "").lower()
    scheme = settings.scheme or (
        parsed.scheme if parsed.scheme in ("http", "https") else None
    ) or ("https" if ssl_env in ("1", "true") else "http")  # fmt: skip
    ca_cert = settings.ca_cert or env.get("CONSUL_CACERT")
    verify: bool | str
    if settings.verify is not None:
        verify = settings.verify
    elif env.get("CONSUL_HTTP_SSL_VERIFY", "").lower() in ("0", "false"):
        verify = False
    else:
        verify = True
    if verify and ca_cert:
        verify = str(ca_cert)
    client_cert = settings.client_cert or env.get("CONSUL_CLIENT_CERT")
    client_key = settings.client_key or env.get("CONSUL_CLIENT_KEY")
    cert: tuple[str, str] | str | None = None
    if client_cert and client_key:
        cert = (str(client_cert), str(client_key))
    elif client_cert:
        cert = str(client_cert)
    token = settings.token.get_secret_value() if settings.token else env.get("CONSUL_HTTP_TOKEN")
    if not token and env.get("CONSUL_HTTP_TOKEN_FILE"):
        token_file = Path(env["CONSUL_HTTP_TOKEN_FILE"])
        try:
            token = token_file.read_text(encoding="utf-8").strip()
        except OSError as exc:
            raise RegistryError(
                f"CONSUL_HTTP_TOKEN_FILE: cannot read {token_file}: {exc.strerror}"
            ) from None
    return ConsulConnection(
        host=parsed.hostname or "127.0.0.1",
        port=port or (443 if scheme == "https" else 8500),
        scheme=scheme,
        token=token or None,
        verify=verify,
        cert=cert,
    )


def _duration(seconds: float) -> str:
    """A Go duration string Consul parses (millisecond resolution)."""
    return f"{max(1, round(seconds * 1000))}ms"


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
        except (BadRequest, ClientError) as exc:
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

    async def aclose(self) -> None:
        if self._closed:
            return
        self._closed = True
        self._pool.shutdown(wait=False, cancel_futures=True)
        # Abort blocking queries still parked in the pool.
        self._client.http.session.close()

    # -- catalog ----------------------------------------------------------

    async def register(self, info: InstanceInfo, ttl_s: float) -> None:
        check = {
            "CheckID": f"service:{info.id}",
            "Name": "load heartbeat",
            "TTL": _duration(ttl_s),
            "DeregisterCriticalServiceAfter": _duration(self.settings.deregister_critical_after_s),
            "Status": "passing",
            "Output": load_to_json(LoadReport(), sent_at=time.time()),
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
        ok = await self._call(
            self._client.agent.check.ttl_pass,
            f"service:{instance_id}",
            notes=load_to_json(load, sent_at=time.time()),
        )
        if not ok:  # 404 Unknown check ID: the agent reaped (or never had) it
            raise NotRegistered(instance_id)

    async def deregister(self, instance_id: str) -> None:
        await self._call(self._client.agent.service.deregister, instance_id)

    async def instances(
        self, *, tier: Tier | None = None, region: str | None = None, healthy_only: bool = True
    ) -> list[InstanceState]:
        _, nodes = await self._call(
            self._client.health.service, self.settings.service_name, passing=healthy_only
        )
        return [
            s
            for s in self._states(nodes)
            if (tier is None or s.info.tier == tier) and (region is None or s.info.region == region)
        ]

    async def watch_instances(
        self, index: int, timeout_s: float
    ) -> tuple[int, list[InstanceState]]:
        await self._paced("catalog")
        try:
            new, nodes = await self._call(
                self._client.health.service,
                self.settings.service_name,
                index=index or None,
                wait=_duration(timeout_s),
                passing=True,
            )
            new_index = int(new)
            if new_index < index:  # the index went backwards: start over
                new, nodes = await self._call(
                    self._client.health.service, self.settings.service_name, passing=True
                )
                new_index = int(new)
        finally:
            self._last_watch["catalog"] = time.monotonic()
        return max(new_index, 1), self._states(nodes)

    def _states(self, nodes: list[dict[str, Any]] | None) -> list[InstanceState]:
        states = []
        for entry in nodes or []:
            svc = entry["Service"]
            checks = entry.get("Checks") or []
            own = next(
                (c for c in checks if c.get("CheckID") == f"service:{svc['ID']}"), {"Output": ""}
            )
            address = svc.get("Address") or (entry.get("Node") or {}).get("Address", "")
            states.append(
                InstanceState(
                    info=info_from_meta(
                        svc["ID"], address, int(svc.get("Port") or 0), svc.get("Tags"),
                        svc.get("Meta"),
                    ),
                    load=load_from_json(own.get("Output")),
                    healthy=bool(checks) and all(c.get("Status") == "passing" for c in checks),
                    last_heartbeat=_sent_at(own.get("Output")),
                )
            )  # fmt: skip
        states.sort(key=lambda s: s.info.id)
        return states

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
        _, items = await self._call(self._client.kv.get, prefix, recurse=True)
        return [_entry(i) for i in items or []]

    async def watch_prefix(
        self, prefix: str, index: int, timeout_s: float
    ) -> tuple[int, list[KVEntry]]:
        await self._paced("kv:" + prefix)
        try:
            new, items = await self._call(
                self._client.kv.get,
                prefix,
                recurse=True,
                index=index or None,
                wait=_duration(timeout_s),
            )
            new_index = int(new)
            if new_index < index:
                new, items = await self._call(self._client.kv.get, prefix, recurse=True)
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
        # agent's own floor is its session_ttl_min, so send the body ourselves.
        body = {
            "Name": holder,
            "TTL": _duration(ttl_s),
            "Behavior": "release",
            "LockDelay": "0s",
        }
        params = [("dc", self.settings.datacenter)] if self.settings.datacenter else []
        sid: str = self._client.http.put(
            CB.json(is_id=True),
            "/v1/session/create",
            params=params,
            headers=self._client.prepare_headers(),
            data=json.dumps(body),
        )
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
