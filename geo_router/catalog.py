"""Where candidates come from: static upstreams polled by URL, and the registry.

The router only ever calls a :data:`CandidateSource` (a function returning
the current ``list[InstanceState]``) and a :data:`TrafficSource`; both are
snapshots kept fresh by background loops that the app's lifespan runs. When
the registry is unreachable the last-known catalog stays in use and
``stale`` says so.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import aiohttp

from geo_router.settings import UpstreamSettings
from servekit.engine.protocol import LoadReport
from servekit.registry.protocol import InstanceInfo, InstanceState, Registry, RegistryError

__all__ = [
    "CandidateSource",
    "RegistryPoller",
    "StaticUpstreams",
    "TrafficSource",
    "open_registry",
    "parse_traffic",
]

log = logging.getLogger(__name__)

_POLL_TIMEOUT = aiohttp.ClientTimeout(total=2.0)

CandidateSource = Callable[[], Sequence[InstanceState]]
TrafficSource = Callable[[str], Mapping[str, float] | None]


class StaticUpstreams:
    """Instances configured by URL; ``/ready`` and ``/load`` are polled for each."""

    def __init__(
        self, upstreams: Sequence[UpstreamSettings], session: aiohttp.ClientSession
    ) -> None:
        self._upstreams = list(upstreams)
        self._session = session
        self._states: dict[str, InstanceState] = {}

    def snapshot(self) -> list[InstanceState]:
        return list(self._states.values())

    async def refresh(self) -> None:
        await asyncio.gather(*(self._poll(u) for u in self._upstreams))

    async def run(self, interval_s: float) -> None:
        while True:
            await self.refresh()
            await asyncio.sleep(interval_s)

    async def _poll(self, up: UpstreamSettings) -> None:
        iid = up.id or up.url
        load = LoadReport()
        healthy = False
        try:
            async with self._session.get(up.url + "/ready", timeout=_POLL_TIMEOUT) as ready:
                healthy = ready.status == 200
            async with self._session.get(up.url + "/load", timeout=_POLL_TIMEOUT) as resp:
                if resp.status == 200:
                    body = await resp.json(content_type=None)
                    if isinstance(body, dict):
                        load = LoadReport.from_dict(body)
        except (aiohttp.ClientError, OSError, TimeoutError, ValueError, TypeError):
            healthy = False
        host, _, port = up.url.split("://", 1)[1].partition(":")
        info = InstanceInfo(
            id=iid,
            tier=up.tier,
            region=up.region,
            address=host,
            port=int(port.split("/")[0] or 80),
            model=up.model or load.model,
            version=up.version if up.version is not None else load.version,
            capacity=up.capacity or load.capacity or 1,
            meta={"url": up.url},
        )
        healthy = healthy and not load.draining and bool(info.model)
        self._states[iid] = InstanceState(info, load, healthy, time.time())


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


class RegistryPoller:
    """Keeps the last-known catalog and traffic shares from a :class:`Registry`."""

    def __init__(self, registry: Registry) -> None:
        self._registry = registry
        self._instances: list[InstanceState] = []
        self._traffic: dict[str, dict[str, float]] = {}
        self.stale = True

    def snapshot(self) -> list[InstanceState]:
        return self._instances

    def traffic(self, model: str) -> dict[str, float] | None:
        return self._traffic.get(model)

    async def refresh(self) -> None:
        try:
            instances = await self._registry.instances(healthy_only=True)
            entries = await self._registry.list_prefix("models/")
        except (RegistryError, OSError) as exc:
            if not self.stale:
                log.warning("registry unreachable, routing on last-known catalog: %s", exc)
            self.stale = True
            return
        self._instances = instances
        traffic: dict[str, dict[str, float]] = {}
        for entry in entries:
            parts = entry.key.split("/")
            if len(parts) == 3 and parts[2] == "traffic":
                shares = parse_traffic(entry.value)
                if shares:
                    traffic[parts[1]] = shares
        self._traffic = traffic
        self.stale = False

    async def run(self, interval_s: float) -> None:
        while True:
            await self.refresh()
            await asyncio.sleep(interval_s)


def open_registry(settings: dict[str, Any]) -> Registry:
    """The registry named by ``settings`` (``servekit.registry.open_registry``)."""
    import importlib

    module = importlib.import_module("servekit.registry")
    opener = getattr(module, "open_registry", None)
    if opener is None:
        raise RuntimeError("servekit.registry.open_registry is not available in this build")
    registry: Registry = opener(settings)
    return registry


async def cancel_all(tasks: Sequence[asyncio.Task[None]]) -> None:
    for task in tasks:
        task.cancel()
    for task in tasks:
        with contextlib.suppress(asyncio.CancelledError):
            await task
