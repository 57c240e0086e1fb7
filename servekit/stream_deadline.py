"""A total deadline on one answer: however slowly it trickles, it ends.

The send-stall guard (:mod:`servekit.connection_guard`) cuts off a client
that takes nothing; a client that reads a byte now and then, or a generation
that runs on and on, is bounded by nothing else. :func:`stream_deadline`
wraps the part of a request that streams its answer (the serving core's
engine loop, the router's relay) and raises
:class:`~servekit.errors.StreamDeadlineExceeded` once the request is
``limit_s`` old, counted from its arrival. The caller ends the stream with
that error's event and ``[DONE]``; leaving the block cancelled whatever it
awaited (the next token, the upstream, the socket), so its ``finally``
releases the slot and closes the upstream as a disconnect would.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator

from servekit.errors import StreamDeadlineExceeded

__all__ = ["stream_deadline"]


@contextlib.asynccontextmanager
async def stream_deadline(arrival: float, limit_s: float | None) -> AsyncIterator[None]:
    """Run the block until ``limit_s`` after ``arrival`` (a ``time.perf_counter()``);
    past it, :class:`StreamDeadlineExceeded`. ``None``: no deadline."""
    if limit_s is None:
        yield
        return
    left = max(0.0, limit_s - (time.perf_counter() - arrival))
    bound = asyncio.timeout(left)
    try:
        async with bound:
            yield
    except TimeoutError:
        if not bound.expired():
            raise  # the block's own timeout, not the deadline
        raise StreamDeadlineExceeded(
            f"the answer ran past the stream deadline of {limit_s:g}s and was ended"
        ) from None
