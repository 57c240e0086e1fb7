"""The edge agent's model slot: which engine serves new requests, and hot swap.

Each request leases the engine it started on; a swap points new requests at
the new engine at once and closes the old one only after its last lease ends,
so no in-flight request fails because of a swap.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Callable

from servekit.engine.protocol import (
    Engine,
    GenerationEvent,
    GenerationRequest,
    LoadReport,
    prefill_backlog_ahead_ms,
    slot_hold_ms,
    slot_release_ms,
    uncached_tokens,
)

__all__ = ["LeasedEngine", "ModelSlot"]

log = logging.getLogger(__name__)


class LeasedEngine:
    """An engine that counts its open generations."""

    def __init__(self, engine: Engine, version: str) -> None:
        self.engine = engine
        self.version = version
        self.active = 0
        self._idle = asyncio.Event()
        self._idle.set()

    @property
    def model_name(self) -> str:
        return self.engine.model_name

    @property
    def capacity(self) -> int:
        return self.engine.capacity

    async def start(self) -> None:
        await self.engine.start()

    async def ready(self) -> bool:
        return await self.engine.ready()

    async def aclose(self) -> None:
        await self.engine.aclose()

    def load(self) -> LoadReport:
        return self.engine.load()

    # What admission asks an engine that can tell, passed through: without them
    # the edge priced every newcomer behind the whole prefill backlog and every
    # slot at the mean hold, whatever the engine knew.
    def uncached_tokens(self, request: GenerationRequest) -> int | None:
        return uncached_tokens(self.engine, request)

    def prefill_backlog_ahead_ms(self, tokens: int) -> float | None:
        return prefill_backlog_ahead_ms(self.engine, tokens)

    def slot_release_ms(self) -> tuple[float, ...] | None:
        return slot_release_ms(self.engine)

    def slot_hold_ms(self, tokens: int, max_tokens: int | None) -> float | None:
        return slot_hold_ms(self.engine, tokens, max_tokens)

    def generate(self, request: GenerationRequest) -> AsyncIterator[GenerationEvent]:
        return self._generate(request)

    async def _generate(self, request: GenerationRequest) -> AsyncIterator[GenerationEvent]:
        self.active += 1
        self._idle.clear()
        events = self.engine.generate(request)
        try:
            async for event in events:
                yield event
        finally:
            await events.aclose()  # type: ignore[attr-defined]
            self.active -= 1
            if self.active == 0:
                self._idle.set()

    async def wait_idle(self, within_s: float) -> bool:
        try:
            await asyncio.wait_for(self._idle.wait(), within_s)
        except TimeoutError:
            return False
        return True


class ModelSlot:
    def __init__(self, engine: Engine, version: str) -> None:
        self._current = LeasedEngine(engine, version)
        self._swap_lock = asyncio.Lock()
        self._retiring: set[asyncio.Task[None]] = set()

    def current(self) -> LeasedEngine:
        return self._current

    @property
    def version(self) -> str:
        return self._current.version

    async def swap(self, engine: Engine, version: str, *, drain_timeout: float = 120.0) -> None:
        """Start ``engine`` (load + warm), then make it current.

        If starting fails, the old engine keeps serving and the error propagates.
        """
        async with self._swap_lock:
            new = LeasedEngine(engine, version)
            try:
                await new.start()
            except BaseException:
                await engine.aclose()
                raise
            old, self._current = self._current, new
            log.info("swapped model %s -> %s", old.version, version)
            task = asyncio.create_task(self._retire(old, drain_timeout))
            self._retiring.add(task)
            task.add_done_callback(self._retiring.discard)

    async def replace_when_idle(
        self,
        engine: Engine,
        version: str,
        *,
        rebuild_old: Callable[[], Engine],
        drain_timeout: float = 120.0,
    ) -> None:
        """Swap when memory cannot hold two models: wait for in-flight requests,
        close the old engine, then load the new one. If the new one fails, the
        old model is loaded again so the node keeps serving."""
        async with self._swap_lock:
            old = self._current
            await old.wait_idle(drain_timeout)
            await old.aclose()
            new = LeasedEngine(engine, version)
            try:
                await new.start()
            except BaseException:
                await engine.aclose()
                restored = LeasedEngine(rebuild_old(), old.version)
                await restored.start()
                self._current = restored
                raise
            self._current = new

    async def _retire(self, old: LeasedEngine, within_s: float) -> None:
        if not await old.wait_idle(within_s):
            log.warning("closing version %s with %d requests still open", old.version, old.active)
        await old.aclose()

    async def aclose(self, drain_timeout: float = 30.0) -> None:
        await self._current.wait_idle(drain_timeout)
        await self._current.aclose()
        for task in list(self._retiring):
            await task
