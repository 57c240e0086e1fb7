"""Where candidates and canary shares come from.

The router only ever calls a :data:`CandidateSource` (a function returning
the current ``list[InstanceState]``) and a :data:`TrafficSource`. The app's
lifespan builds them from the registry's :class:`~servekit.registry.CatalogView`
(over the configured registry, and over the static ``upstreams:`` entries)
and from :class:`TrafficPoller`, which keeps the last-known
``models/<model>/traffic`` shares from the registry's KV store.

Load figures come from the instances themselves: the static entries' probes
read ``/load`` with ``/ready``, and :class:`~geo_router.live_load.LiveLoad`
polls ``/load`` of every instance the registry lists (the catalog gives
membership, health and identity). Both use the one client
:func:`probe_client` builds; whatever the upstreams require of a caller
(credentials) is set there.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace

import httpx
from prometheus_client import CollectorRegistry

from geo_router.live_load import LiveLoad
from servekit.registry import CatalogView, RegistrySettings, StaticEntry, StaticSettings
from servekit.registry.factory import open_registry
from servekit.registry.protocol import InstanceInfo, InstanceState, KVStore, RegistryError
from servekit.registry.static import StaticRegistry

__all__ = [
    "CandidateSource",
    "Discovery",
    "TrafficPoller",
    "TrafficSource",
    "cancel_all",
    "merge_sources",
    "open_discovery",
    "parse_traffic",
    "probe_client",
]

log = logging.getLogger(__name__)

CandidateSource = Callable[[], Sequence[InstanceState]]
TrafficSource = Callable[[str], Mapping[str, float] | None]


def probe_client(timeout_s: float = 1.0) -> httpx.AsyncClient:
    """The router's one HTTP client for probing upstreams (``/ready``, ``/load``)."""
    return httpx.AsyncClient(timeout=timeout_s)


def merge_sources(sources: Sequence[CandidateSource]) -> CandidateSource:
    """One source over several; the first to list an instance id wins."""
    if len(sources) == 1:
        return sources[0]

    def merged() -> list[InstanceState]:
        seen: dict[str, InstanceState] = {}
        for source in sources:
            for state in source():
                seen.setdefault(state.info.id, state)
        return list(seen.values())

    return merged


def _with_reported_model(source: CandidateSource) -> CandidateSource:
    """Static entries configured without a model take the one their /load reports."""
    cache: dict[int, tuple[InstanceState, InstanceState]] = {}  # per probed state object

    def fill(s: InstanceState) -> InstanceState:
        hit = cache.get(id(s))
        if hit is not None and hit[0] is s:
            return hit[1]
        info = replace(s.info, model=s.load.model, version=s.info.version or s.load.version)
        filled = replace(s, info=info, healthy=s.healthy and bool(s.load.model))
        if len(cache) > 1024:
            cache.clear()
        cache[id(s)] = (s, filled)
        return filled

    def filled() -> list[InstanceState]:
        return [s if s.info.model else fill(s) for s in source()]

    return filled


def parse_traffic(value: bytes) -> dict[str, float] | None:
    """``{"shares": {"v1": 0.9, "v2": 0.1}}`` → shares; ``None`` if malformed."""
    try:
        data = json.loads(value)
    except ValueError:
        return None
    shares = data.get("shares") if isinstance(data, dict) else None
    if not isinstance(shares, dict):
        return None
    out = {
        str(k): float(v)
        for k, v in shares.items()
        if isinstance(v, int | float) and not isinstance(v, bool) and v > 0
    }
    return out or None


class TrafficPoller:
    """Last-known canary shares per model from ``models/<model>/traffic`` in the KV store."""

    def __init__(self, kv: KVStore) -> None:
        self._kv = kv
        self._traffic: dict[str, dict[str, float]] = {}

    def traffic(self, model: str) -> dict[str, float] | None:
        return self._traffic.get(model)

    async def refresh(self) -> None:
        try:
            entries = await self._kv.list_prefix("models/")
        except (RegistryError, OSError) as exc:
            log.debug("traffic shares not refreshed (keeping last-known): %s", exc)
            return
        traffic: dict[str, dict[str, float]] = {}
        for entry in entries:
            parts = entry.key.split("/")
            if len(parts) == 3 and parts[2] == "traffic":
                shares = parse_traffic(entry.value)
                if shares:
                    traffic[parts[1]] = shares
        self._traffic = traffic

    async def run(self, interval_s: float) -> None:
        while True:
            await self.refresh()
            await asyncio.sleep(interval_s)


async def cancel_all(tasks: Sequence[asyncio.Task[None]]) -> None:
    for task in tasks:
        task.cancel()
    for task in tasks:
        with contextlib.suppress(asyncio.CancelledError):
            await task


@dataclass(slots=True)
class Discovery:
    candidates: CandidateSource
    traffic: TrafficPoller | None
    stale: Callable[[], bool]  # the registry view runs on a last-known catalog
    kv: KVStore | None = None  # the registry's KV store, when there is a registry


async def open_discovery(
    stack: contextlib.AsyncExitStack,
    *,
    upstreams: Sequence[StaticEntry],
    registry: RegistrySettings | None,
    poll_interval_s: float,
    given: CandidateSource | None = None,
    metrics_registry: CollectorRegistry | None = None,
    fresh_timeout_s: float = 3.0,
    probe_client_for: Callable[[InstanceInfo], httpx.AsyncClient] | None = None,
) -> Discovery:
    """Catalog views over the static entries and the registry; closed by ``stack``.

    ``probe_client_for`` gives the client (token, CA bundle) probing an instance;
    without it every probe uses :func:`probe_client`'s.
    """
    sources: list[CandidateSource] = [] if given is None else [given]
    views: list[CatalogView] = []
    client = probe_client()
    stack.push_async_callback(client.aclose)
    if upstreams:
        static = StaticRegistry(
            StaticSettings(entries=list(upstreams), probe_interval_s=poll_interval_s),
            client,
            client_for=probe_client_for,
        )
        await static.start()
        stack.push_async_callback(static.aclose)
        static_view = CatalogView(static)
        views.append(static_view)
        sources.append(_with_reported_model(static_view.snapshot))
    poller: TrafficPoller | None = None
    live: LiveLoad | None = None
    stale: Callable[[], bool] = lambda: False  # noqa: E731
    backend = None
    if registry is not None:
        backend = await open_registry(registry)
        stack.push_async_callback(backend.aclose)
        view = CatalogView(backend, metrics_registry=metrics_registry)
        views.append(view)
        stale = lambda: view.stale  # noqa: E731
        poller = TrafficPoller(backend)
        await poller.refresh()
        tasks = [asyncio.create_task(poller.run(poll_interval_s))]
        stack.push_async_callback(cancel_all, tasks)
        if registry.backend == "static":  # its probes already read /load
            sources.append(view.snapshot)
        else:
            live = LiveLoad(
                view,
                probe_client_for or (lambda _info: client),
                poll_interval_s,
                metrics_registry=metrics_registry,
            )
            sources.append(live.snapshot)
    for v in views:
        await v.start()
        stack.push_async_callback(v.aclose)
    # Serve with a fresh catalog when it comes quickly; a registry that is
    # down at start is a runtime condition (stale), not a crash.
    await asyncio.gather(*(v.wait_fresh(fresh_timeout_s) for v in views))
    if live is not None:
        await live.poll_once()  # the first requests route on live load too
        polling = asyncio.create_task(live.run())
        stack.push_async_callback(live.stop, polling)
    return Discovery(merge_sources(sources), poller, stale, backend if registry else None)
