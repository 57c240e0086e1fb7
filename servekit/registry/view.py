"""A reader's last-known catalog, kept fresh by a background watch.

The router reads :meth:`CatalogView.snapshot` on every request; it never
waits on the registry. A background task runs blocking queries
(:meth:`Catalog.watch_instances`) and swaps in each new list. When the
registry cannot be reached the view keeps serving the last list it had, turns
:attr:`CatalogView.stale` on (and the optional gauge/callback with it), retries
with capped exponential backoff, and clears the flag on the first success.

A listing the registry answered but ACLs filtered (:class:`AccessFiltered`)
is treated the same way, never as the whole fleet, and logged as an error
(again every minute while it lasts): an empty "healthy" fleet caused by a
token without read rights must not look like an outage of every instance.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable

from prometheus_client import CollectorRegistry, Counter, Gauge

from servekit.registry.protocol import (
    AccessFiltered,
    Catalog,
    InstanceState,
    RegistryError,
    RegistryUnavailable,
    Tier,
)

__all__ = ["CatalogView"]

log = logging.getLogger(__name__)


class CatalogView:
    """Last-known healthy instances from ``catalog``.

    ``on_stale(stale)`` is called whenever staleness flips. With
    ``metrics_registry`` the view exports ``registry_catalog_stale`` (0/1),
    ``registry_catalog_last_success_timestamp_seconds``,
    ``registry_catalog_instances`` and ``registry_catalog_errors_total{kind}``
    (``unavailable``, ``acl_filtered``, ``error``) into that registry (never
    the global one).
    """

    error_log_every_s = 60.0

    def __init__(
        self,
        catalog: Catalog,
        *,
        wait_s: float = 10.0,
        retry_initial_s: float = 0.2,
        retry_max_s: float = 5.0,
        on_stale: Callable[[bool], None] | None = None,
        metrics_registry: CollectorRegistry | None = None,
    ) -> None:
        self.catalog = catalog
        self.wait_s = wait_s
        self.retry_initial_s = retry_initial_s
        self.retry_max_s = retry_max_s
        self._on_stale = on_stale
        self._states: list[InstanceState] = []
        self._stale = True  # nothing known yet
        self._last_success: float | None = None
        self._index = 0
        self._task: asyncio.Task[None] | None = None
        self._changed = asyncio.Condition()
        self._generation = 0
        self._stale_gauge: Gauge | None = None
        self._count_gauge: Gauge | None = None
        self._errors: Counter | None = None
        self._last_error: tuple[str, float] | None = None  # message, when logged
        self.last_error: RegistryError | None = None
        if metrics_registry is not None:
            self._stale_gauge = Gauge(
                "registry_catalog_stale",
                "1 while the catalog view serves a last-known list it could not refresh.",
                registry=metrics_registry,
            )
            self._stale_gauge.set(1)
            last = Gauge(
                "registry_catalog_last_success_timestamp_seconds",
                "Unix time of the last successful catalog read.",
                registry=metrics_registry,
            )
            last.set_function(lambda: self._last_success or 0.0)
            self._count_gauge = Gauge(
                "registry_catalog_instances",
                "Healthy instances in the last-known catalog.",
                registry=metrics_registry,
            )
            self._errors = Counter(
                "registry_catalog_errors",
                "Failed catalog reads, by kind: unavailable, acl_filtered (the token may not"
                " read every instance), error.",
                ["kind"],
                registry=metrics_registry,
            )

    @property
    def stale(self) -> bool:
        """True before the first read and while the registry is unreachable."""
        return self._stale

    @property
    def last_success(self) -> float | None:
        """Unix time of the last successful read, ``None`` before the first."""
        return self._last_success

    @property
    def index(self) -> int:
        return self._index

    @property
    def generation(self) -> int:
        """Moves on every published update (list or staleness): cheap change detection."""
        return self._generation

    def snapshot(
        self, *, tier: Tier | None = None, region: str | None = None
    ) -> list[InstanceState]:
        """The last-known healthy instances (optionally of one tier/region)."""
        return [
            s
            for s in self._states
            if (tier is None or s.info.tier == tier) and (region is None or s.info.region == region)
        ]

    async def start(self) -> None:
        if self._task is None:
            self._task = asyncio.create_task(self._run(), name="catalog-view")

    async def wait_fresh(self, timeout_s: float) -> bool:
        """Wait until the view has read the catalog since it was last stale."""

        async def fresh() -> None:
            async with self._changed:
                await self._changed.wait_for(lambda: not self._stale)

        try:
            await asyncio.wait_for(fresh(), timeout_s)
        except TimeoutError:
            return False
        return True

    async def wait_changed(self, timeout_s: float) -> bool:
        """Wait for the next update of the list (or staleness); False on timeout."""
        seen = self._generation

        async def changed() -> None:
            async with self._changed:
                await self._changed.wait_for(lambda: self._generation != seen)

        try:
            await asyncio.wait_for(changed(), timeout_s)
        except TimeoutError:
            return False
        return True

    async def aclose(self) -> None:
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

    async def _run(self) -> None:
        backoff = self.retry_initial_s
        while True:
            try:
                index, states = await self.catalog.watch_instances(self._index, self.wait_s)
            except RegistryError as exc:
                self._failed(exc)
                # Start over with a plain read: a restarted registry's index may be lower.
                self._index = 0
                await self._publish(stale=True)
                await asyncio.sleep(backoff)
                backoff = min(self.retry_max_s, backoff * 2)
                continue
            backoff = self.retry_initial_s
            self._last_error = None
            self.last_error = None
            self._index = index
            self._states = states
            self._last_success = time.time()
            await self._publish(stale=False)

    def _failed(self, exc: RegistryError) -> None:
        self.last_error = exc
        unavailable = isinstance(exc, RegistryUnavailable)
        kind = "unavailable" if unavailable else "acl_filtered" if isinstance(
            exc, AccessFiltered) else "error"  # fmt: skip
        if self._errors is not None:
            self._errors.labels(kind).inc()
        if unavailable:
            if not self._stale:
                log.warning("registry unreachable, serving last-known catalog: %s", exc)
            return
        now = time.monotonic()
        last = self._last_error
        if last is None or last[0] != str(exc) or now - last[1] >= self.error_log_every_s:
            self._last_error = (str(exc), now)
            log.error("catalog read failed, serving last-known catalog (%d instances): %s",
                      len(self._states), exc)  # fmt: skip

    async def _publish(self, *, stale: bool) -> None:
        flipped = stale != self._stale
        self._stale = stale
        if self._stale_gauge is not None:
            self._stale_gauge.set(1 if stale else 0)
        if self._count_gauge is not None:
            self._count_gauge.set(len(self._states))
        if flipped and self._on_stale is not None:
            try:
                self._on_stale(stale)
            except Exception:
                log.exception("on_stale callback failed")
        async with self._changed:
            self._generation += 1
            self._changed.notify_all()
