"""Static entries: a fixed list of instances for setups without a registry.

The configured list is the whole catalog. Health comes from polling each
instance's ``/ready`` (200 = healthy; :func:`servekit.health_probe.probe_health`)
every ``probe_interval_s``, and its load from ``/load`` (a JSON
:class:`LoadReport`) when that endpoint exists. How long each ``/load`` read
took is the reader's round trip to the entry (``InstanceState.rtt_ms``: the
minimum of the recent ones, :class:`servekit.rtt.MeasuredRtt`).
An answer other than 200 takes an entry out at once; no answer at all does
after ``unreachable_after`` probes in a row (the request path's own failure
handling covers the seconds between).

Writes are deliberately harmless where they come from instances and loud
where they need shared state:

* ``register`` / ``heartbeat`` / ``deregister`` are no-ops (an edge agent
  configured with a static registry keeps running; the list is the truth);
* KV and locks raise :class:`RegistryError`: desired state and "one rollout
  at a time" need a real store (embedded or Consul).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import time
import urllib.parse
from collections.abc import Callable

import httpx

from servekit.engine.protocol import LoadReport
from servekit.errors import ServeError
from servekit.health_probe import probe_health
from servekit.load_reading import LoadNotReported, read_load_report
from servekit.peers import PeerProblems
from servekit.registry.protocol import (
    InstanceInfo,
    InstanceState,
    KVEntry,
    LockHandle,
    RegistryError,
    Tier,
)
from servekit.registry.settings import StaticEntry, StaticSettings
from servekit.rtt import MeasuredRtt
from servekit.winddown import pause, wind_down

__all__ = ["StaticRegistry", "entry_info"]

log = logging.getLogger(__name__)


def entry_info(entry: StaticEntry) -> InstanceInfo:
    parsed = urllib.parse.urlparse(entry.url)
    if parsed.scheme not in ("http", "https") or not parsed.hostname:
        raise ValueError(f"static entry url must be http(s)://host[:port], got {entry.url!r}")
    port = parsed.port or (443 if parsed.scheme == "https" else 80)
    return InstanceInfo(
        id=entry.id or entry.url.rstrip("/"),
        tier=entry.tier,
        region=entry.region,
        address=parsed.hostname,
        port=port,
        model=entry.model,
        version=entry.version,
        capacity=entry.capacity,
        tags=tuple(entry.tags),
        meta={"url": entry.url.rstrip("/"), "scheme": parsed.scheme},
    )


class StaticRegistry:
    """:class:`~servekit.registry.protocol.Registry` over a configured list."""

    def __init__(
        self,
        settings: StaticSettings,
        client: httpx.AsyncClient | None = None,
        *,
        client_for: Callable[[InstanceInfo], httpx.AsyncClient] | None = None,
    ) -> None:
        """``client_for`` picks the (borrowed) client probing an entry, e.g. one with
        that tier's service token and CA bundle; ``client`` otherwise."""
        self.settings = settings
        self._infos = [(entry_info(e), e.url.rstrip("/")) for e in settings.entries]
        self._own_client = client is None
        self._client = client or httpx.AsyncClient(timeout=settings.probe_timeout_s)
        self._client_for = client_for
        self._problems = PeerProblems(log)
        self._states: dict[str, InstanceState] = {
            info.id: InstanceState(info=info, load=LoadReport(), healthy=False, last_heartbeat=0.0)
            for info, _ in self._infos
        }
        self._unanswered: dict[str, int] = {}  # probes in a row without an answer, by id
        self._rtt = {info.id: MeasuredRtt() for info, _ in self._infos}
        self._index = 1
        self._changed = asyncio.Condition()
        self._task: asyncio.Task[None] | None = None
        self._stopping = asyncio.Event()

    async def start(self) -> None:
        """Probe every entry once, then keep probing in the background."""
        if self._task is None:
            await self.probe_once()
            self._stopping = asyncio.Event()
            self._task = asyncio.create_task(self._run(), name="static-registry-probe")

    async def aclose(self) -> None:
        """Stop probing (a round under way may finish first, ``servekit.winddown``)."""
        task, self._task = self._task, None
        if task is not None:
            await wind_down(task, self._stopping)
        if self._own_client:
            await self._client.aclose()

    async def _run(self) -> None:
        while not await pause(self._stopping, self.settings.probe_interval_s):
            await self.probe_once()

    async def probe_once(self) -> None:
        results = await asyncio.gather(*(self._probe(info, url) for info, url in self._infos))
        changed = False
        for state in results:
            old = self._states[state.info.id]
            if (old.healthy, old.load, old.rtt_ms) != (state.healthy, state.load, state.rtt_ms):
                changed = True
            self._states[state.info.id] = state
        if changed:
            async with self._changed:
                self._index += 1
                self._changed.notify_all()

    async def _probe(self, info: InstanceInfo, url: str) -> InstanceState:
        old = self._states[info.id]
        client = self._client_for(info) if self._client_for is not None else self._client
        # A refused certificate or token is said once (self._problems).
        ready = await probe_health(client, url + "/ready", problems=self._problems)
        unanswered: str | None = ready.reason if ready.failure is not None else None
        load = old.load
        if unanswered is None:
            try:
                load = await self._read_load(client, url, self._rtt[info.id]) or old.load
            except ServeError as exc:
                self._problems.failed(url, exc)
                unanswered = exc.message
        if unanswered is not None:
            log.debug("static probe of %s failed: %s", url, unanswered)
            missed = self._unanswered[info.id] = self._unanswered.get(info.id, 0) + 1
            if missed < self.settings.unreachable_after:
                return old
            return dataclasses.replace(old, healthy=False)
        self._unanswered.pop(info.id, None)
        seen = time.time() if ready.up else old.last_heartbeat
        return InstanceState(
            info=info,
            load=load,
            healthy=ready.up,
            last_heartbeat=seen,
            rtt_ms=self._rtt[info.id].ms,
        )

    async def _read_load(
        self, client: httpx.AsyncClient, url: str, rtt: MeasuredRtt
    ) -> LoadReport | None:
        """The entry's report, its round trip added to ``rtt``; None without
        ``load_path`` or when it answered without one. Could not ask it: the mapped
        error (``servekit.load_reading``)."""
        if not self.settings.load_path:
            return None
        try:
            return await read_load_report(client, url, path=self.settings.load_path, rtt=rtt)
        except LoadNotReported as exc:
            self._problems.status(url, exc.answered)  # a refused token says so, once
            return None

    # -- catalog (read side) -------------------------------------------------

    async def instances(
        self, *, tier: Tier | None = None, region: str | None = None, healthy_only: bool = True
    ) -> list[InstanceState]:
        return [
            s
            for s in sorted(self._states.values(), key=lambda s: s.info.id)
            if (tier is None or s.info.tier == tier)
            and (region is None or s.info.region == region)
            and (s.healthy or not healthy_only)
        ]

    async def watch_instances(
        self, index: int, timeout_s: float
    ) -> tuple[int, list[InstanceState]]:
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(timeout_s):
                async with self._changed:
                    await self._changed.wait_for(lambda: self._index != index)
        return self._index, await self.instances()

    # -- writes: no-ops for instances, errors for shared state ----------------

    async def register(self, info: InstanceInfo, ttl_s: float) -> None:
        log.debug("static registry: ignoring registration of %s", info.id)

    async def heartbeat(self, instance_id: str, load: LoadReport) -> None:
        return None

    async def deregister(self, instance_id: str) -> None:
        return None

    def _no_kv(self) -> RegistryError:
        return RegistryError("the static registry has no KV store; use embedded or consul")

    async def get(self, key: str) -> KVEntry | None:
        raise self._no_kv()

    async def put(self, key: str, value: bytes) -> None:
        raise self._no_kv()

    async def put_if(self, key: str, value: bytes, modify_index: int) -> bool:
        raise self._no_kv()

    async def delete(self, key: str) -> None:
        raise self._no_kv()

    async def list_prefix(self, prefix: str) -> list[KVEntry]:
        raise self._no_kv()

    async def watch_prefix(
        self, prefix: str, index: int, timeout_s: float
    ) -> tuple[int, list[KVEntry]]:
        raise self._no_kv()

    async def acquire_lock(self, key: str, holder: str, ttl_s: float) -> LockHandle | None:
        raise self._no_kv()

    async def renew_lock(self, lock: LockHandle) -> bool:
        raise self._no_kv()

    async def release_lock(self, lock: LockHandle) -> None:
        raise self._no_kv()
