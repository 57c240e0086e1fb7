"""The simulation's clock and events, on one virtual-time asyncio loop.

The simulated instances schedule callbacks (:meth:`EventLoop.at`,
:meth:`EventLoop.after`); the router's dispatcher runs as coroutines
(:meth:`EventLoop.spawn`). Both are on the same
:class:`~hybrid_llm.fleet.sim.virtual_loop.VirtualLoop`, so one virtual clock
drives the instances and the dispatcher's deadlines and hedges alike.
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import Callable, Coroutine
from typing import Any

from hybrid_llm.fleet.sim.virtual_loop import VirtualLoop

__all__ = ["EventLoop"]


class EventLoop:
    """Runs callbacks and coroutines in time order; ties keep scheduling order."""

    def __init__(self) -> None:
        self.aio = VirtualLoop()
        self.processed = 0  # callbacks run (coroutine steps are not counted)
        # A callback's or a task's error ends the run and is raised from it (asyncio
        # would log it and go on).
        self._failure: BaseException | None = None
        self.aio.set_exception_handler(self._failed)

    @property
    def now(self) -> float:
        return self.aio.time()

    def at(self, when: float, callback: Callable[..., None], *args: Any) -> None:
        self.aio.call_at(when, self._fire, callback, args)

    def after(self, delay: float, callback: Callable[..., None], *args: Any) -> None:
        self.at(self.now + delay, callback, *args)

    def spawn(self, coro: Coroutine[Any, Any, None]) -> None:
        """Run ``coro`` as a task from now on (an error in it ends the run)."""
        self.aio.create_task(coro).add_done_callback(self._check)

    def run(self, until: float = math.inf) -> None:
        """Run everything due up to ``until`` (the clock stops at the last of it)."""
        self.aio.until = until
        # A simulation may run inside an async caller (a check run from a server): its
        # loop is set aside for the virtual one's run, as a nested call.
        outer = asyncio._get_running_loop()
        asyncio._set_running_loop(None)
        try:
            self.aio.run_forever()
        finally:
            asyncio._set_running_loop(outer)
        if self._failure is not None:
            failure, self._failure = self._failure, None
            raise failure

    def _fire(self, callback: Callable[..., None], args: tuple[Any, ...]) -> None:
        self.processed += 1
        callback(*args)

    def _check(self, task: asyncio.Task[None]) -> None:
        if not task.cancelled() and task.exception() is not None:
            self._failed(self.aio, {"exception": task.exception()})

    def _failed(self, loop: asyncio.AbstractEventLoop, context: dict[str, Any]) -> None:
        if self._failure is None:
            exc = context.get("exception")
            self._failure = exc if exc is not None else RuntimeError(context.get("message"))
        loop.stop()
