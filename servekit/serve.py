"""Running a service under uvicorn: draining on SIGTERM, TLS, reload on SIGHUP.

On the first SIGINT/SIGTERM the service is marked draining *before* uvicorn
stops accepting connections, so `/ready` turns 503 and the registry hears
about it while in-flight requests finish within the grace period. After
that clean shutdown uvicorn raises the signal again, as its default action
would: SIGTERM ends the process by that signal; Ctrl-C (SIGINT) returns from
:func:`run_service`, so the command exits 0 like the project's other
long-running commands (and uvicorn's own CLI), without a ``KeyboardInterrupt``
traceback.

With ``tls`` the service listens with :func:`servekit.tls.server_context`.
SIGHUP calls ``on_reload`` (which re-reads the settings file and applies
what can change live, e.g. accepted tokens; it returns the TLS settings now
in force) and loads the certificate files into the listening context again:
connections already open, and the streams on them, are not touched; new
handshakes get the renewed certificate. A reload whose settings file no
longer loads (a missing token file, a certificate that does not match its
key) is logged and changes nothing.

Every log handler gets :class:`servekit.secrets.RedactingFilter`, so URL
credentials and bearer tokens never reach a log line.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
import ssl
from collections.abc import Callable
from types import FrameType
from typing import Any

import uvicorn

from servekit.connection_guard import ConnectionLimits, OnClose, guarded_protocol
from servekit.secrets import RedactingFilter
from servekit.tls import ServerTLSSettings, reload_server_context, server_context

__all__ = ["ReloadFn", "run_service"]

log = logging.getLogger(__name__)

ReloadFn = Callable[[], ServerTLSSettings | None]


class _Server(uvicorn.Server):
    def __init__(
        self,
        config: uvicorn.Config,
        on_drain: Callable[[], None],
        tls: ServerTLSSettings | None,
        on_reload: ReloadFn | None,
    ) -> None:
        super().__init__(config)
        self._on_drain = on_drain
        self._tls = tls
        self._on_reload = on_reload

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        try:
            self._on_drain()
        finally:
            super().handle_exit(sig, frame)

    async def startup(self, sockets: list[Any] | None = None) -> None:
        await super().startup(sockets)
        asyncio.get_running_loop().add_signal_handler(signal.SIGHUP, self.reload)

    def reload(self) -> None:
        """Re-read settings and certificates; keep everything as it was on failure."""
        try:
            tls = self._on_reload() if self._on_reload is not None else self._tls
            live: ssl.SSLContext | None = self.config.ssl
            if live is not None and tls is not None:
                reload_server_context(live, tls)
            elif (live is None) != (tls is None):
                log.warning("turning TLS on or off needs a restart; kept as it was")
            self._tls = tls
        except Exception as exc:
            log.error("reload failed, nothing changed: %s", exc)
            return
        log.info("reloaded settings%s", " and certificates" if live is not None else "")


def _redact_log_handlers() -> None:
    redact = RedactingFilter()
    for name in (None, "uvicorn", "uvicorn.error", "uvicorn.access"):
        for handler in logging.getLogger(name).handlers:
            handler.addFilter(redact)


def run_service(
    app: Any,
    *,
    host: str,
    port: int,
    on_drain: Callable[[], None] = lambda: None,
    log_level: str = "info",
    graceful_s: float = 30.0,
    limits: ConnectionLimits | None = None,
    on_close: OnClose | None = None,
    tls: ServerTLSSettings | None = None,
    on_reload: ReloadFn | None = None,
) -> None:
    """Serve ``app`` until a signal stops it.

    The HTTP protocol is uvicorn's httptools protocol with each response's
    head sent together with its first body bytes (:mod:`servekit.http_protocol`)
    and ``limits`` on slow readers, slow request heads and connections
    (:mod:`servekit.connection_guard`; None: no limits), each connection they close
    reported to ``on_close``.
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
        http=guarded_protocol(limits or ConnectionLimits(), on_close),
        loop="uvloop",
        access_log=False,
        # Longer than any client pool keeps an idle connection (the router's:
        # 30 s), so clients close first and never reuse a socket we just shut.
        timeout_keep_alive=75,
    )
    _redact_log_handlers()  # after uvicorn's Config has set up its own handlers
    if tls is not None:
        config.load()
        config.ssl = server_context(tls)  # ours, so SIGHUP can reload it in place
    # SIGINT comes back as KeyboardInterrupt once the graceful shutdown is done
    # (or while starting up): everything is closed; a traceback would only alarm.
    with contextlib.suppress(KeyboardInterrupt):
        _Server(config, on_drain, tls, on_reload).run()
