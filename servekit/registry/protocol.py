"""The registry seam: a catalog of serving instances and a small KV store.

Two backends implement :class:`Registry` with identical async signatures:
Consul (production, through ``py-consul``) and an embedded store that several
processes on one machine share. Nothing outside ``servekit.registry`` knows
which one it holds.

Errors: :class:`RegistryError` is the base; :class:`RegistryUnavailable`
(unreachable, retry later), :class:`NotRegistered` (a beat for an instance
the registry forgot), :class:`WrongAgent` (a beat reached an agent that does
not hold the instance while another does), :class:`RegistryRejected` (an
invalid request, never retried) and :class:`AccessFiltered` (ACLs hid part of
a listing).

Watches follow Consul's blocking-query model: pass the index you last saw and
a timeout; the call returns when the data changed past that index or the
timeout ran out, with the new index. Index 0 returns at once.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Literal, Protocol, runtime_checkable

from servekit.engine.protocol import LoadReport

__all__ = [
    "AccessFiltered",
    "Catalog",
    "InstanceInfo",
    "InstanceState",
    "KVEntry",
    "KVStore",
    "LockHandle",
    "NotRegistered",
    "Registry",
    "RegistryError",
    "RegistryRejected",
    "RegistryUnavailable",
    "Tier",
    "WrongAgent",
]

Tier = Literal["edge", "center"]


class RegistryError(Exception):
    """Base of registry failures."""


class RegistryUnavailable(RegistryError):
    """The backend could not be reached; readers fall back to the last-known view."""


class NotRegistered(RegistryError):
    """A heartbeat for an instance the registry no longer knows (it expired)."""


class RegistryRejected(RegistryError):
    """The registry refused the request as invalid (Consul's 400): sending the
    same request again cannot succeed, so callers stop instead of retrying."""


class WrongAgent(RegistryError):
    """A heartbeat reached a registry agent that does not hold the instance while
    another one does (Consul: the address points at a load balancer or a server,
    not the instance's local agent). Registering again there would leave two
    copies on two nodes, so the caller reports it and does not."""


class AccessFiltered(RegistryError):
    """The registry answered, but its ACLs hid part of the answer (Consul sets
    ``X-Consul-Results-Filtered-By-ACLs``): the token lacks read rights, and
    the listing must not be taken for the whole fleet."""


@dataclass(frozen=True, slots=True)
class InstanceInfo:
    """What an instance registers once; its load travels in heartbeats."""

    id: str
    tier: Tier
    region: str
    address: str
    port: int
    model: str
    version: str = ""
    capacity: int = 1
    tags: tuple[str, ...] = ()
    meta: Mapping[str, str] = field(default_factory=dict)

    @property
    def url(self) -> str:
        """Base URL; ``meta["scheme"]`` is ``https`` for an instance that serves TLS."""
        host = f"[{self.address}]" if ":" in self.address else self.address
        return f"{self.meta.get('scheme', 'http')}://{host}:{self.port}"


@dataclass(frozen=True, slots=True)
class InstanceState:
    """An instance as a reader sees it: identity, last load report, health."""

    info: InstanceInfo
    load: LoadReport
    healthy: bool
    last_heartbeat: float
    # The reader's own round trip to it in ms, timed on its load polls
    # (servekit.rtt.MeasuredRtt); None where nothing timed one.
    rtt_ms: float | None = None


@dataclass(frozen=True, slots=True)
class KVEntry:
    key: str
    value: bytes
    modify_index: int
    create_index: int = 0
    session: str | None = None


@dataclass(frozen=True, slots=True)
class LockHandle:
    """A held single-holder lock; ``session`` is the backend's lease id."""

    key: str
    holder: str
    session: str
    ttl_s: float


@runtime_checkable
class Catalog(Protocol):
    async def register(self, info: InstanceInfo, ttl_s: float) -> None:
        """Add or replace an instance; it expires unless heartbeated within ``ttl_s``."""
        ...

    async def heartbeat(self, instance_id: str, load: LoadReport) -> None:
        """Mark alive and publish load. Raises :class:`NotRegistered` if it expired."""
        ...

    async def deregister(self, instance_id: str) -> None: ...

    async def instances(
        self, *, tier: Tier | None = None, region: str | None = None, healthy_only: bool = True
    ) -> list[InstanceState]: ...

    async def watch_instances(
        self, index: int, timeout_s: float
    ) -> tuple[int, list[InstanceState]]:
        """Blocking query over all healthy instances."""
        ...


@runtime_checkable
class KVStore(Protocol):
    async def get(self, key: str) -> KVEntry | None: ...

    async def put(self, key: str, value: bytes) -> None: ...

    async def put_if(self, key: str, value: bytes, modify_index: int) -> bool:
        """Compare-and-swap: write only if the key's modify index is still
        ``modify_index`` (0: only if the key does not exist)."""
        ...

    async def delete(self, key: str) -> None: ...

    async def list_prefix(self, prefix: str) -> list[KVEntry]: ...

    async def watch_prefix(
        self, prefix: str, index: int, timeout_s: float
    ) -> tuple[int, list[KVEntry]]: ...

    async def acquire_lock(self, key: str, holder: str, ttl_s: float) -> LockHandle | None:
        """Take the lock if free (or expired); ``None`` if someone else holds it."""
        ...

    async def renew_lock(self, lock: LockHandle) -> bool:
        """Extend the lease; ``False`` if it was lost."""
        ...

    async def release_lock(self, lock: LockHandle) -> None: ...


@runtime_checkable
class Registry(Catalog, KVStore, Protocol):
    async def aclose(self) -> None: ...
