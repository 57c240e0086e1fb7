"""Registering the gateway in the fleet registry as tier ``center``.

With a ``registry:`` block in the config the gateway registers one instance
(its address, the public model name, the replicas' total capacity) and the
shared :class:`~servekit.registry.Heartbeater` beats the aggregate load
report (what ``/load`` shows), so the geo router sees the center's queue like
any edge's; draining is announced before connections close. Without a
``registry:`` block the gateway runs standalone.
"""

from __future__ import annotations

import logging
import socket
from collections.abc import Callable

from central.settings import CentralSettings
from servekit.engine.protocol import LoadReport
from servekit.registry import Heartbeater, InstanceInfo, Registry, open_registry

__all__ = ["Registration", "center_instance"]

log = logging.getLogger(__name__)


def center_instance(settings: CentralSettings, capacity: int) -> InstanceInfo:
    """The catalog entry for this gateway."""
    address = settings.instance.advertise_address or settings.server.host
    if address in ("0.0.0.0", "::", ""):
        address = socket.gethostname()
    return InstanceInfo(
        id=settings.instance.id,
        tier="center",
        region=settings.instance.region,
        address=address,
        port=settings.server.port,
        model=settings.model,
        version=settings.version,
        capacity=capacity,
        tags=tuple(sorted({r.kind for r in settings.replicas})),
        meta=settings.server.instance_meta(),
    )


class Registration:
    """Registration plus load heartbeats for the gateway's lifetime."""

    def __init__(
        self, settings: CentralSettings, load: Callable[[], LoadReport], capacity: int
    ) -> None:
        self._settings = settings
        self._load = load
        self._capacity = capacity
        self._registry: Registry | None = None
        self.heartbeater: Heartbeater | None = None

    async def start(self) -> None:
        config = self._settings.registry
        if config is None:
            return
        self._registry = await open_registry(config)
        info = center_instance(self._settings, self._capacity)
        self.heartbeater = Heartbeater(
            self._registry,
            info,
            self._load,
            interval_s=config.heartbeat_interval_s,
            ttl_s=config.ttl_s,
        )
        await self.heartbeater.start()
        log.info("registering %s (tier center) at %s", info.id, info.url)

    def mark_draining(self) -> None:
        """Tell the fleet before connections close (safe from a signal hook)."""
        if self.heartbeater is not None:
            self.heartbeater.mark_draining()

    async def aclose(self) -> None:
        if self.heartbeater is not None:
            await self.heartbeater.stop()
            self.heartbeater = None
        if self._registry is not None:
            await self._registry.aclose()
            self._registry = None
