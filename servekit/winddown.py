"""Stopping a background poller without cutting a request halfway.

A poller that is cancelled in the middle of a round cancels its requests
wherever they are; httpcore closes a connection whose TLS handshake failed but
not one whose handshake was cancelled, and the socket leaks (a
``ResourceWarning`` at some later garbage collection). So a poller loops until
an event is set, and :func:`wind_down` sets it, lets the round under way finish
for a moment, and only then cancels.
"""

from __future__ import annotations

import asyncio
import contextlib

__all__ = ["GRACE_S", "pause", "wind_down"]

GRACE_S = 1.0  # how long a round under way may take to finish before it is cut


async def wind_down(
    task: asyncio.Task[None], stopping: asyncio.Event, grace_s: float = GRACE_S
) -> None:
    """Set ``stopping``, give ``task`` up to ``grace_s`` to return, then cancel it."""
    stopping.set()
    _, pending = await asyncio.wait({task}, timeout=grace_s)
    if pending:
        task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task


async def pause(stopping: asyncio.Event, interval_s: float) -> bool:
    """Wait ``interval_s`` between rounds; ``True`` once ``stopping`` is set."""
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(stopping.wait(), interval_s)
    return stopping.is_set()
