"""Keep one instance registered and its load report fresh, whatever the registry does.

The service owning a :class:`Heartbeater` starts it in its lifespan and stops
it on shutdown. The loop never raises into the host: a heartbeat that finds
the instance gone (expired and reaped) re-registers it; an unreachable
registry is retried with exponential backoff (capped below the TTL so a
recovered registry sees the instance again before readers give up on it);
anything else is logged and retried the same way, except a request the
registry refused as invalid (:class:`RegistryRejected`, Consul's 400): that
stops the loop with an error, since the same request can never succeed.

Identity that a Consul agent would refuse (meta keys, sizes: see
:func:`~servekit.registry.codec.check_meta`) fails :meth:`Heartbeater.start`
at once, whichever backend is configured, so a misconfigured service refuses
to start instead of retrying forever.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import random
from collections.abc import Callable

from servekit.engine.protocol import LoadReport
from servekit.registry.codec import check_meta
from servekit.registry.protocol import (
    InstanceInfo,
    NotRegistered,
    Registry,
    RegistryError,
    RegistryRejected,
    RegistryUnavailable,
    WrongAgent,
)

__all__ = ["Heartbeater"]

log = logging.getLogger(__name__)


class Heartbeater:
    """Registers ``info`` and beats ``load()`` every ``interval_s``.

    ``load`` is called on the event loop each beat and must be cheap (the
    engine's and admission queue's counters). ``ttl_s`` is what the registry
    waits before calling the instance dead; keep ``interval_s`` well below it.
    """

    def __init__(
        self,
        registry: Registry,
        info: InstanceInfo,
        load: Callable[[], LoadReport],
        interval_s: float = 3.0,
        ttl_s: float = 10.0,
        *,
        max_backoff_s: float | None = None,
    ) -> None:
        self.registry = registry
        self.info = info
        self._load = load
        self.interval_s = interval_s
        self.ttl_s = ttl_s
        self.max_backoff_s = max_backoff_s if max_backoff_s is not None else max(interval_s, 1.0)
        self._draining = False
        self._registered = False
        self._task: asyncio.Task[None] | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._drain_task: asyncio.Task[None] | None = None
        self.beats = 0
        self.failures = 0
        self.registrations = 0
        self.rejected: RegistryRejected | None = None  # why the loop gave up, if it did

    @property
    def registered(self) -> bool:
        """Whether the last call to the registry succeeded with the instance known."""
        return self._registered

    def current_load(self) -> LoadReport:
        report = self._load()
        if self._draining and not report.draining:
            report = dataclasses.replace(report, draining=True, ready=False)
        return report

    async def start(self) -> None:
        """Start beating in a background task. Does not wait for the registry:
        an unreachable registry at start must not keep the service down.
        Raises :class:`RegistryRejected` at once for identity no registry
        would accept (the service should refuse to start)."""
        check_meta(self.info)
        if self._task is None:
            self._loop = asyncio.get_running_loop()
            self._task = asyncio.create_task(self._run(), name=f"heartbeat:{self.info.id}")

    async def draining(self) -> None:
        """Publish a draining (not ready) report now, then keep beating it."""
        self._draining = True
        if self._task is None:
            return
        try:
            await self.registry.heartbeat(self.info.id, self.current_load())
            self.beats += 1
        except RegistryError as exc:
            log.warning("draining heartbeat for %s failed: %s", self.info.id, exc)

    def mark_draining(self) -> None:
        """:meth:`draining` for synchronous callers (a SIGTERM hook such as
        ``run_service(on_drain=...)``): flag it and beat as soon as the loop can."""
        self._draining = True
        loop = self._loop
        if loop is not None and self._task is not None and not loop.is_closed():
            loop.call_soon_threadsafe(self._spawn_drain_beat)

    def _spawn_drain_beat(self) -> None:
        self._drain_task = asyncio.get_running_loop().create_task(self.draining())

    def update_info(self, info: InstanceInfo) -> None:
        """Publish changed identity (a new model version): re-register on the next beat.
        Raises :class:`RegistryRejected` (and keeps the old identity) if invalid."""
        check_meta(info)
        self.info = info
        self._registered = False

    async def stop(self, deregister: bool = True) -> None:
        """Stop beating and (by default) remove the instance from the registry."""
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        if self._drain_task is not None:
            await asyncio.gather(self._drain_task, return_exceptions=True)
            self._drain_task = None
        if deregister:
            try:
                await self.registry.deregister(self.info.id)
            except RegistryError as exc:  # it will expire on its TTL
                log.warning("deregistering %s failed: %s", self.info.id, exc)
        self._registered = False

    async def _run(self) -> None:
        backoff = 0.0
        while True:
            try:
                await self._beat_once()
                backoff = 0.0
                delay = self.interval_s
            except asyncio.CancelledError:
                raise
            except RegistryRejected as exc:
                self.failures += 1
                self._registered = False
                self.rejected = exc
                log.error("registry refused %s; no longer retrying: %s", self.info.id, exc)
                return
            except WrongAgent as exc:  # keep beating; never register a second copy
                self.failures += 1
                log.error("%s", exc)
                delay = self.interval_s
                await asyncio.sleep(delay)
                continue
            except Exception as exc:  # never crash the host service
                self.failures += 1
                self._registered = False
                backoff = min(self.max_backoff_s, max(0.1, backoff * 2 or 0.1))
                delay = backoff * random.uniform(0.8, 1.2)
                level = logging.INFO if isinstance(exc, RegistryUnavailable) else logging.WARNING
                log.log(level, "heartbeat for %s failed (retry in %.2fs): %s",
                        self.info.id, delay, exc)  # fmt: skip
            await asyncio.sleep(delay)

    async def _beat_once(self) -> None:
        if not self._registered:
            await self._register()
        try:
            await self.registry.heartbeat(self.info.id, self.current_load())
        except NotRegistered:
            log.info("%s expired from the registry; registering again", self.info.id)
            await self._register()
            await self.registry.heartbeat(self.info.id, self.current_load())
        self.beats += 1
        self._registered = True

    async def _register(self) -> None:
        await self.registry.register(self.info, self.ttl_s)
        self.registrations += 1
        self._registered = True
