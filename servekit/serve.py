"""Running a service under uvicorn, with draining announced on SIGTERM.

On the first SIGINT/SIGTERM the service is marked draining *before* uvicorn
stops accepting connections, so `/ready` turns 503 and the registry hears
about it while in-flight requests finish within the grace period.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from types import FrameType
from typing import Any

import uvicorn

from servekit.http_protocol import HeadWithBodyProtocol

__all__ = ["run_service"]


class _DrainingServer(uvicorn.Server):
    def __init__(self, config: uvicorn.Config, on_drain: Callable[[], None]) -> None:
        super().__init__(config)
        self._on_drain = on_drain

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        try:
            self._on_drain()
        finally:
            super().handle_exit(sig, frame)


def run_service(
    app: Any,
    *,
    host: str,
    port: int,
    on_drain: Callable[[], None] = lambda: None,
    log_level: str = "info",
    graceful_s: float = 30.0,
    http: type[asyncio.Protocol] | str = HeadWithBodyProtocol,
) -> None:
    """Serve ``app``; ``http`` is uvicorn's HTTP protocol (a name or a protocol class).

    The default is uvicorn's httptools protocol with each response's head sent
    together with its first body bytes (:mod:`servekit.http_protocol`).
    """
    logging.basicConfig(
        level=log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    # One INFO line per HTTP request (every probe and scrape of an engine) drowns the log.
    logging.getLogger("httpx").setLevel(max(logging.WARNING, logging.root.level))
    config = uvicorn.Config(
        app,
        host=host,
        port=port,
        log_level=log_level,
        timeout_graceful_shutdown=int(graceful_s),
        http=http,
        loop="uvloop",
        access_log=False,
        # Longer than any client pool keeps an idle connection (the router's:
        # 30 s), so clients close first and never reuse a socket we just shut.
        timeout_keep_alive=75,
    )
    _DrainingServer(config, on_drain).run()
