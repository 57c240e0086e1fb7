"""One attempt at one candidate: acquired, judged and released exactly once.

An :class:`Attempt` takes the candidate's in-flight slot when it is made and
gives it back through exactly one verdict: :meth:`~Attempt.failed` (it never
primed), :meth:`~Attempt.finished` (the stream ended), :meth:`~Attempt.broke`
(it died mid-stream) or :meth:`~Attempt.abandon` (a lost hedge, a client that
left). ``geo_router.routed`` decides which attempts to make; the tracker
bookkeeping of each is here and nowhere else.

Two refusals move on without counting as failures: a 429 (the instance is
busy: it ranks last for ``shed_backoff_s``, its circuit stays closed) and a
``context_length_exceeded`` 400 (the request is too long *there*: only
candidates with a larger context window are tried after it).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from geo_router.scoring import Scored
from geo_router.settings import HedgeSettings, RoutingSettings
from geo_router.tracker import Tracker
from geo_router.upstream import Primed
from servekit.errors import (
    ContextLengthExceeded,
    RateLimited,
    ServeError,
    UpstreamTimeout,
    UpstreamUnavailable,
)

__all__ = [
    "Attempt",
    "after_overflow",
    "first_token_deadline_s",
    "hedge_delay_s",
    "larger_window",
    "payload",
]


def first_token_deadline_s(routing: RoutingSettings, cand: Scored, last: bool = False) -> float:
    """How long an attempt at ``cand`` may wait for its first token: the fixed
    deadline, or a multiple of what the planner predicted there when that is
    longer (a long prompt's prefill), never past the whole request's timeout.

    The ``last`` candidate of the try order waits for the whole timeout (the
    upstream's silence is still cut at ``idle_timeout_s``): the deadline is
    there to fail over, and with nobody left, cutting an instance that admitted
    the request would turn a slow answer into a 504."""
    if last:
        return routing.request_timeout_s
    predicted = routing.ttft_deadline_factor * cand.predicted_ms / 1000.0
    return min(max(routing.ttft_deadline_s, predicted), routing.request_timeout_s)


def hedge_delay_s(hedge: HedgeSettings, tracker: Tracker, cand: Scored) -> float:
    """How long an attempt at ``cand`` may take before a hedge races it: the router's
    own P95 TTFT there, else the instance's reported P95, else the default."""
    p95 = tracker.stats(cand.id).ttft_p95_ms() or cand.state.load.ttft_p95_ms
    delay = p95 if p95 is not None else hedge.default_delay_ms
    return max(hedge.min_delay_ms, delay) / 1000.0


def larger_window(failed: Scored, cand: Scored) -> bool:
    """May ``cand`` hold what overflowed ``failed``'s context window?"""
    if failed.window is not None and cand.window is not None:
        return cand.window > failed.window
    return failed.tier == "edge" and cand.tier == "center"


def after_overflow(cands: Sequence[Scored], nxt: int, failed: Scored) -> list[Scored]:
    """The try order after ``failed`` overflowed: untried ones with a larger window only."""
    return [*cands[:nxt], *(c for c in cands[nxt:] if larger_window(failed, c))]


def payload(body: dict[str, Any], cand: Scored) -> bytes:
    """The request body as ``cand`` gets it: its model name, its trimmed messages."""
    out = dict(body)
    out["model"] = cand.state.info.model
    if cand.trim is not None and "messages" in out:
        out["messages"] = cand.trim.apply(out["messages"])
    return json.dumps(out, ensure_ascii=False, separators=(",", ":")).encode()


def cause(err: ServeError) -> str:
    """The ``cause`` label of a fallback."""
    if isinstance(err, ContextLengthExceeded):
        return "context_length"
    if isinstance(err, UpstreamTimeout):
        return "timeout"
    if isinstance(err, UpstreamUnavailable):
        return "unavailable"
    if isinstance(err, RateLimited):
        return "rate_limited"
    return "error"


class Attempt:
    """``cand``'s in-flight slot from creation until its one verdict."""

    __slots__ = ("_ended", "_tracker", "cand", "index", "primed")

    def __init__(self, tracker: Tracker, cand: Scored, index: int) -> None:
        self._tracker = tracker
        self.cand = cand
        self.index = index  # its place in the try order
        self.primed: Primed | None = None
        self._ended = False
        tracker.acquire(cand.id)

    @property
    def ended(self) -> bool:
        return self._ended

    def won(self, primed: Primed) -> None:
        """It primed first: the TTFT counts; the slot stays taken while it streams."""
        self.primed = primed
        self._tracker.success(self.cand.id, primed.ttft_s * 1000.0)

    def failed(self, err: ServeError, shed_backoff_s: float) -> bool:
        """It never primed; whether the next candidate may be tried."""
        if not self._release():
            return True
        iid = self.cand.id
        if isinstance(err, ContextLengthExceeded):
            self._tracker.abandoned(iid)
            return True
        if not err.retryable:
            self._tracker.abandoned(iid)
            return False
        if isinstance(err, RateLimited):
            self._tracker.refused(iid, shed_backoff_s)
        else:
            self._tracker.failure(iid)
        return True

    async def finished(self) -> None:
        """The stream ended well: read its tail so the connection is reused."""
        if self._release() and self.primed is not None:
            await self.primed.finish()

    async def broke(self) -> None:
        """It died mid-stream: a failure of the instance."""
        if self._release():
            self._tracker.failure(self.cand.id)
            if self.primed is not None:
                await self.primed.aclose()

    async def abandon(self, primed: Primed | None = None) -> None:
        """Ended without a verdict (a lost hedge or tie, a client that left)."""
        primed = primed or self.primed
        if self._release():
            self._tracker.abandoned(self.cand.id)
        if primed is not None:
            await primed.aclose()

    def _release(self) -> bool:
        if self._ended:
            return False
        self._ended = True
        self._tracker.release(self.cand.id)
        return True
