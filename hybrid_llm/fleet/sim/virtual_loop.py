"""An asyncio event loop on virtual time: waiting costs no wall time.

:class:`VirtualLoop` is an ``asyncio.BaseEventLoop`` whose :meth:`~VirtualLoop.time`
is a number it keeps itself. Where a real loop polls its selector with a
timeout until the next timer is due, this one's "selector" moves the clock to
that timer at once and reports no I/O (the loop does none: no sockets, no
threads). So ``asyncio.sleep``, ``asyncio.timeout`` and ``call_at`` behave as
on a real loop, in the same order, while a minute of simulated waiting takes
as long as the callbacks in it.

Ties keep scheduling order: timers due at the same time run in the order they
were scheduled (asyncio's own timer heap compares due times only), so a run is
the same for the same inputs.

``until`` bounds a run: once the next timer is due after it, the loop stops
without moving the clock there (what stays scheduled stays, for a later run).
With nothing ready and nothing scheduled nothing can ever happen, and the loop
stops too (``run_until_complete`` then says its future never completed).
"""

from __future__ import annotations

import asyncio
import heapq
import math
from collections.abc import Callable
from contextvars import Context
from typing import Any, TypeVarTuple

__all__ = ["VirtualLoop"]

_Ts = TypeVarTuple("_Ts")


class _Timer(asyncio.TimerHandle):
    """A timer ordered by due time, then by when it was scheduled."""

    __slots__ = ("_key",)

    def __init__(
        self,
        when: float,
        seq: int,
        callback: Callable[..., object],
        args: tuple[Any, ...],
        loop: asyncio.AbstractEventLoop,
        context: Context | None,
    ) -> None:
        super().__init__(when, callback, args, loop, context)
        self._key = (when, seq)  # one comparison in C: the timer heap is the hot path

    def __lt__(self, other: asyncio.TimerHandle) -> bool:
        if isinstance(other, _Timer):
            return self._key < other._key
        return self.when() < other.when()


class _Advance:
    """What the loop polls for I/O: it moves virtual time instead of waiting."""

    __slots__ = ("_loop",)

    def __init__(self, loop: VirtualLoop) -> None:
        self._loop = loop

    def select(self, timeout: float | None) -> list[Any]:
        self._loop._advance(timeout)
        return []


class VirtualLoop(asyncio.BaseEventLoop):
    """An event loop whose clock jumps to its next timer instead of sleeping."""

    def __init__(self, start: float = 0.0) -> None:
        super().__init__()
        self._now = start
        self._timers = 0
        self._selector = _Advance(self)  # asyncio's _run_once polls it
        self.until = math.inf  # a run stops before a timer due after this

    def time(self) -> float:
        return self._now

    def call_at(
        self,
        when: float,
        callback: Callable[[*_Ts], object],
        *args: *_Ts,
        context: Context | None = None,
    ) -> asyncio.TimerHandle:
        self._check_closed()  # type: ignore[attr-defined]
        self._timers += 1
        timer = _Timer(when, self._timers, callback, args, self, context)
        heapq.heappush(self._scheduled, timer)  # type: ignore[attr-defined]
        timer._scheduled = True  # type: ignore[attr-defined]
        return timer

    def _advance(self, timeout: float | None) -> None:
        """Called where a real loop would wait up to ``timeout`` for I/O."""
        if timeout == 0:
            return  # callbacks are ready: no time passes
        scheduled: list[asyncio.TimerHandle] = self._scheduled  # type: ignore[attr-defined]
        if timeout is None or scheduled[0].when() > self.until:
            self.stop()  # nothing can happen any more, or not before the bound
            return
        # Exactly the timer's due time: asyncio caps a wait at a day, a virtual one need not.
        self._now = max(self._now, scheduled[0].when())

    def _process_events(self, event_list: list[Any]) -> None:
        return None  # no I/O

    def _write_to_self(self) -> None:
        return None  # no other thread to wake it

    def __del__(self, _warn: Any = None) -> None:
        return None  # it holds no OS resource: nothing to warn about when left unclosed
