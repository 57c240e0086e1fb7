"""The settings blocks every service shares: ``server:``, ``instance:``, ``admission:``.

Router, edge agent and central gateway read the same block shapes; a service
subclasses a block only to give it other defaults (its port, its queue). The
``serve`` command's flags are generated from the ``server:`` and
``instance:`` blocks (:mod:`servekit.serve_cli`), so a field added here is a
flag everywhere.
"""

from __future__ import annotations

import socket
from typing import TYPE_CHECKING, Literal

from pydantic import Field

from servekit.config import Section
from servekit.service_auth import ServiceAuthSettings
from servekit.tls import ServerTLSSettings

if TYPE_CHECKING:  # the guards import uvicorn, which reading settings does not need
    from servekit.connection_guard import ConnectionLimits

__all__ = [
    "AdmissionSettings",
    "InstanceSettings",
    "LogLevel",
    "ServerSecurity",
    "ServerSettings",
    "ServiceServerSettings",
    "advertised_address",
]

LogLevel = Literal["debug", "info", "warning", "error"]


class ServerSecurity(Section):
    """Who may call a service and how it is reached: service tokens and TLS."""

    auth: ServiceAuthSettings = Field(
        default_factory=ServiceAuthSettings,
        description="Service tokens callers must send (tokens_file, tokens_env, sha256); "
        "none configured: anyone who reaches the port may call.",
    )
    tls: ServerTLSSettings | None = Field(None, description="Serve HTTPS with this certificate.")

    def instance_meta(self) -> dict[str, str]:
        """Catalog meta of an instance served this way (readers build its URL from it)."""
        return {"scheme": "https"} if self.tls is not None else {}


class ServerSettings(Section):
    """Where and how a service listens (``server:``); the router's block."""

    host: str = Field("127.0.0.1", description="Address to listen on.")
    port: int = Field(8000, ge=0, le=65535, description="Port to listen on.")
    max_body_bytes: int = Field(1 << 20, ge=1024, description="Larger bodies get 413.")
    graceful_shutdown_s: float = Field(30.0, ge=0, description="Time to finish in-flight work.")
    log_level: LogLevel = Field("info", description="Log level of the service's own logger.")
    tls: ServerTLSSettings | None = Field(None, description="Serve HTTPS with this certificate.")
    allow_unauthenticated: bool = Field(
        False,
        description="Start on a non-loopback address even though callers need no token or "
        "API key (a service refuses to otherwise).",
    )
    send_stall_s: float | None = Field(
        30.0,
        gt=0,
        description="A client that takes none of a response's bytes for this long (its "
        "socket's buffers full) is disconnected: the stream ends and its slot and upstream "
        "are released. null: wait forever.",
    )
    stream_deadline_s: float | None = Field(
        600.0,
        gt=0,
        description="An answer still running this long after its request arrived is ended: "
        "a stream gets an error event (code stream_deadline_exceeded) and [DONE], its "
        "upstream or engine slot is released. null: no bound.",
    )
    header_timeout_s: float | None = Field(
        10.0,
        gt=0,
        description="A request's line and headers must arrive within this long of the "
        "connection or of the request's first byte; else 408 and the connection closes.",
    )
    max_header_bytes: int | None = Field(
        65536, ge=1024, description="Larger request heads get 431 and the connection closes."
    )
    max_connections: int | None = Field(
        8192,
        ge=1,
        description="Open connections above this get 503 too_many_connections at once "
        "(Retry-After: 1).",
    )

    def connection_limits(self) -> ConnectionLimits:
        """The HTTP server's per-connection guards (:mod:`servekit.connection_guard`)."""
        from servekit.connection_guard import ConnectionLimits

        return ConnectionLimits(
            send_stall_s=self.send_stall_s,
            header_timeout_s=self.header_timeout_s,
            max_header_bytes=self.max_header_bytes,
            max_connections=self.max_connections,
        )


class ServiceServerSettings(ServerSettings, ServerSecurity):
    """The ``server:`` block of a service called by other services (edge, center):
    it also takes service tokens."""

    @property
    def open_because(self) -> str | None:
        """Why anyone may call the service (None: a service token is required)."""
        return None if self.auth.enabled else "server.auth has no tokens"


class InstanceSettings(Section):
    """Who this instance is in the fleet registry (``instance:``)."""

    id: str = Field(default_factory=socket.gethostname, description="Unique instance id.")
    region: str = Field("local", min_length=1, description="Region this instance serves.")
    advertise_address: str | None = Field(
        None, description="Address others reach this instance at (default: server.host)."
    )


class AdmissionSettings(Section):
    """The bounded two-priority queue in front of an engine (``admission:``)."""

    max_waiting: int = Field(16, ge=0, description="Requests that may wait; more get 429.")
    batch_every: int = Field(
        4, ge=1, description="One grant in N goes to waiting batch work, so it is never starved."
    )
    ttft_budget_ms: float | None = Field(
        None,
        gt=0,
        description="Refuse at once (429) a request whose predicted TTFT exceeds this; "
        "none: only a full queue refuses.",
    )
    ttft_budget_quantile: float | None = Field(
        None,
        gt=0,
        lt=1,
        description="Judge a request's predicted TTFT raised by how much later than "
        "predicted recent admitted requests got their first token, at this quantile "
        "(0.9: the lateness nine in ten stayed within), so that the budget holds for "
        "about that share; none: the prediction alone.",
    )


def advertised_address(instance: InstanceSettings, server: ServerSettings) -> str:
    """The address the registry gives others: the advertised one, else the bound host,
    else (bound to every interface) this machine's name."""
    address = instance.advertise_address or server.host
    if address in ("0.0.0.0", "::", ""):
        address = socket.gethostname()
    return address
