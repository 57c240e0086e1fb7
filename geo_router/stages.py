"""The router's stages of one request, timed as they pass, shown as ``Server-Timing``.

Every routed request is timed at the end of each stage (a ``perf_counter``
reading and a list append: always on). The stages follow one another, so
they add up to the time from arrival to the first token: ``auth`` (the API
key), ``body`` (validation and the token cap), ``limit`` (the tenant's rate
limit), ``region`` (the user's region), ``classify`` (task and difficulty,
only for ``auto`` requests), ``plan`` (scoring and ordering the candidates)
and ``upstream`` (from the first attempt's request to the first token,
failovers and hedges included). The same stages are the router's intake
spans when tracing is on (``geo_router.spans``).
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from itertools import pairwise

__all__ = ["Stages"]


class Stages:
    """The ends of one request's stages, from its arrival on."""

    __slots__ = ("marks",)

    def __init__(self, arrived: float) -> None:
        self.marks: list[tuple[str, float]] = [("", arrived)]

    def mark(self, name: str, at: float | None = None) -> None:
        """Stage ``name`` ended now (or at the ``perf_counter`` reading ``at``)."""
        self.marks.append((name, time.perf_counter() if at is None else at))

    def spans(self) -> Iterator[tuple[str, float, float]]:
        """Each stage as (name, began, ended)."""
        for (_, began), (name, ended) in pairwise(self.marks):
            yield name, began, ended

    def server_timing(self) -> str:
        """The ``Server-Timing`` header: each stage's milliseconds."""
        return ", ".join(
            f"{name};dur={(end - began) * 1e3:.2f}" for name, began, end in self.spans()
        )
