"""Following the catalog across refreshes: who left, and which models exist.

Every ``interval_s`` (the catalog's poll interval) :class:`Membership` reads
the candidate source and

* tells the tracker which instances are still listed
  (:meth:`~geo_router.tracker.Tracker.forget_missing`): the per-instance
  stats of one that left are dropped, so when it comes back it is new again
  and ramps up through slow start instead of taking full weight while cold;
* remembers each listed model for ``remember_s``: a catalog lists only
  healthy instances, so while the one instance of a model drains or
  restarts, the model is missing from it. A request for it is then a 503
  with ``Retry-After`` ("come back shortly"), not a 404 ("no such model").
"""

from __future__ import annotations

import asyncio
import time

from geo_router.catalog import CandidateSource
from geo_router.tracker import Tracker

__all__ = ["Membership"]


class Membership:
    def __init__(self, source: CandidateSource, tracker: Tracker, remember_s: float = 600.0):
        self._source = source
        self._tracker = tracker
        self._remember_s = remember_s
        self._models: dict[str, float] = {}  # model -> monotonic time last listed

    def refresh(self, now: float | None = None) -> None:
        now = time.monotonic() if now is None else now
        listed = self._source()
        self._tracker.forget_missing({s.info.id for s in listed})
        for state in listed:
            if state.info.model:
                self._models[state.info.model] = now
        for model in [m for m, seen in self._models.items() if now - seen > self._remember_s]:
            del self._models[model]

    def known(self, model: str) -> bool:
        """Was ``model`` listed lately (it may be back in a moment)?"""
        return model in self._models

    async def run(self, interval_s: float) -> None:
        while True:
            self.refresh()
            await asyncio.sleep(interval_s)
