"""The discrete-event core: a heap of ``(time, seq, callback, args)``."""

from __future__ import annotations

import heapq
from collections.abc import Callable
from typing import Any

__all__ = ["EventLoop"]


class EventLoop:
    """Runs callbacks in time order; ties keep scheduling order."""

    def __init__(self) -> None:
        self.now = 0.0
        self._heap: list[tuple[float, int, Callable[..., None], tuple[Any, ...]]] = []
        self._seq = 0
        self.processed = 0

    def at(self, when: float, callback: Callable[..., None], *args: Any) -> None:
        self._seq += 1
        heapq.heappush(self._heap, (when, self._seq, callback, args))

    def after(self, delay: float, callback: Callable[..., None], *args: Any) -> None:
        self.at(self.now + delay, callback, *args)

    def run(self, until: float = float("inf")) -> None:
        heap = self._heap
        pop = heapq.heappop
        while heap and heap[0][0] <= until:
            when, _, callback, args = pop(heap)
            self.now = when
            callback(*args)
            self.processed += 1
