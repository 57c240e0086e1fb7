"""Registering the gateway in the fleet registry as tier ``center``.

The gateway registers one instance (its own address, the public model name,
the replicas' total capacity) and heartbeats the aggregate load report, so
the geo router sees the center's queue depth like any edge's.

HOOK: the registry backends and the shared heartbeat helper
(``servekit.registry`` Heartbeater) are built on the ``registry`` branch.
Until they are on main, :meth:`Registration.start` only logs that
registration was asked for; :func:`center_instance` already builds what will
be registered.
"""

from __future__ import annotations

import logging
import socket
from collections.abc import Callable

from central.settings import CentralSettings
from servekit.engine.protocol import LoadReport
from servekit.registry import InstanceInfo

__all__ = ["Registration", "center_instance"]

log = logging.getLogger(__name__)


def center_instance(settings: CentralSettings, capacity: int) -> InstanceInfo:
    """The catalog entry for this gateway."""
    reg = settings.registration
    address = settings.server.host
    if address in ("0.0.0.0", "::", ""):
        address = socket.gethostname()
    port = settings.server.port
    if reg.advertise_url:
        rest = reg.advertise_url.split("://", 1)[-1].rstrip("/")
        host, _, port_text = rest.rpartition(":")
        address, port = (host, int(port_text)) if host and port_text.isdigit() else (rest, port)
    return InstanceInfo(
        id=reg.instance_id or f"central-{socket.gethostname()}-{settings.server.port}",
        tier="center",
        region=reg.region,
        address=address,
        port=port,
        model=settings.model,
        version=settings.version,
        capacity=capacity,
        tags=tuple(sorted({r.kind for r in settings.replicas})),
    )


class Registration:
    """Registration plus load heartbeats for the gateway's lifetime."""

    def __init__(self, settings: CentralSettings, load: Callable[[], LoadReport]) -> None:
        self._settings = settings
        self._load = load

    async def start(self) -> None:
        if not self._settings.registration.enabled:
            return
        log.warning(
            "registration is enabled but no registry backend is wired into the central "
            "gateway yet; it serves unregistered (see central/registration.py)"
        )

    async def aclose(self) -> None:
        return None
