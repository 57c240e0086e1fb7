"""Joining the fleet registry: register, heartbeat the load, announce draining, leave.

Every serving service (edge agent, central gateway) does it the same way.
With a ``registry:`` block the service registers one instance (built by
``info``, e.g. with :func:`servekit.settings.advertised_address`) and the
shared :class:`~servekit.registry.Heartbeater` beats the load report (what
``/load`` shows), so routers see its queue; draining is announced before
connections close. Without a ``registry:`` block it runs standalone.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from servekit.engine.protocol import LoadReport
from servekit.registry import Heartbeater, InstanceInfo, Registry, RegistrySettings, open_registry
from servekit.registry.protocol import Tier
from servekit.settings import InstanceSettings, ServiceServerSettings, advertised_address

__all__ = ["Registration", "instance_entry"]

log = logging.getLogger(__name__)


def instance_entry(
    instance: InstanceSettings,
    server: ServiceServerSettings,
    *,
    tier: Tier,
    model: str,
    version: str,
    capacity: int,
    tags: tuple[str, ...] = (),
) -> InstanceInfo:
    """The catalog entry of a service served as its ``instance:`` and ``server:`` blocks say."""
    return InstanceInfo(
        id=instance.id,
        tier=tier,
        region=instance.region,
        address=advertised_address(instance, server),
        port=server.port,
        model=model,
        version=version,
        capacity=capacity,
        tags=tags,
        meta=server.instance_meta(),
    )


class Registration:
    """Registration plus load heartbeats for a service's lifetime."""

    def __init__(
        self,
        settings: RegistrySettings | None,
        info: Callable[[], InstanceInfo],
        load: Callable[[], LoadReport],
    ) -> None:
        self._settings = settings
        self._info = info
        self._load = load
        self.registry: Registry | None = None
        self.heartbeater: Heartbeater | None = None

    async def start(self) -> Registry | None:
        """Register and start beating; the open registry (None: standalone)."""
        config = self._settings
        if config is None:
            return None
        self.registry = await open_registry(config)
        info = self._info()
        self.heartbeater = Heartbeater(
            self.registry,
            info,
            self._load,
            interval_s=config.heartbeat_interval_s,
            ttl_s=config.ttl_s,
        )
        await self.heartbeater.start()
        log.info("registering %s (tier %s) at %s", info.id, info.tier, info.url)
        return self.registry

    def update_info(self) -> None:
        """The instance changed (a new model version): say so from the next beat."""
        if self.heartbeater is not None:
            self.heartbeater.update_info(self._info())

    def mark_draining(self) -> None:
        """Tell the fleet before connections close (safe from a signal hook)."""
        if self.heartbeater is not None:
            self.heartbeater.mark_draining()

    async def aclose(self) -> None:
        if self.heartbeater is not None:
            await self.heartbeater.stop()
            self.heartbeater = None
        if self.registry is not None:
            await self.registry.aclose()
            self.registry = None
