"""Noticing that the client went away while we wait on something else.

Starlette only cancels a *streaming* body when the client disconnects. While
a request waits in the admission queue, or runs without streaming, nobody is
listening — so we listen ourselves and abandon the wait, which frees the
queue slot or stops the engine.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable
from typing import TypeVar

from starlette.requests import Request

__all__ = ["ClientGone", "unless_disconnected"]

T = TypeVar("T")


class ClientGone(Exception):
    """The client closed the connection; there is nobody to answer."""


async def _wait_disconnect(request: Request) -> None:
    while True:
        message = await request.receive()
        if message["type"] == "http.disconnect":
            return


async def unless_disconnected(request: Request, work: Awaitable[T]) -> T:
    """Await ``work``; if the client disconnects first, cancel it and raise ClientGone."""
    task = asyncio.ensure_future(work)
    watcher = asyncio.ensure_future(_wait_disconnect(request))
    try:
        done, _ = await asyncio.wait({task, watcher}, return_when=asyncio.FIRST_COMPLETED)
    except BaseException:
        task.cancel()
        watcher.cancel()
        raise
    if task in done:
        watcher.cancel()
        return task.result()
    task.cancel()
    # The work's own failure no longer matters: nobody is there to hear it.
    with contextlib.suppress(BaseException):
        await task
    raise ClientGone()
