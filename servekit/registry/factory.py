"""Build the configured registry backend.

Usage in a lifespan::

    registry = await open_registry(settings.registry)
    try:
        ...
    finally:
        await registry.aclose()

(or ``async with contextlib.aclosing(await open_registry(...)) as registry``).
Opening never waits on a remote registry: a Consul agent that is down at
start is a runtime condition (readers go stale, writers retry), not a crash.
"""

from __future__ import annotations

from collections.abc import Mapping

import httpx

from servekit.registry.consul import ConsulRegistry
from servekit.registry.embedded import EmbeddedRegistry
from servekit.registry.protocol import Registry
from servekit.registry.settings import RegistrySettings
from servekit.registry.static import StaticRegistry

__all__ = ["open_registry"]


async def open_registry(
    settings: RegistrySettings,
    *,
    environ: Mapping[str, str] | None = None,
    http_client: httpx.AsyncClient | None = None,
) -> Registry:
    """Return the backend named by ``settings.backend``, ready to use.

    ``environ`` replaces ``os.environ`` for the ``CONSUL_*`` fallbacks;
    ``http_client`` is used (not closed) by the static backend's probes.
    """
    if settings.backend == "consul":
        consul = ConsulRegistry(settings.consul, environ)
        consul.start_agent_check()  # in the background: logs what the agent's settings mean
        return consul
    if settings.backend == "static":
        static = StaticRegistry(settings.static, http_client)
        await static.start()
        return static
    emb = settings.embedded
    emb.path.parent.mkdir(parents=True, exist_ok=True)
    return EmbeddedRegistry(
        emb.path,
        deregister_after_s=emb.deregister_after_s,
        poll_interval_s=emb.poll_interval_s,
        busy_timeout_s=emb.busy_timeout_s,
    )
