"""The router's settings tree, loaded once from YAML (``configs/router*.yaml``).

The root and its small blocks live here (``server:``, ``classifier:``, and the
upstream hop's ``upstreams:`` and ``peers:``); the larger sections have modules
of their own: ``auth:`` (:mod:`geo_router.auth_settings`), ``region:``
(:mod:`geo_router.region_settings`) and ``routing:``
(:mod:`geo_router.routing_settings`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pydantic import Field, model_validator

import servekit.settings
from geo_router.auth_settings import AuthSettings
from geo_router.policy import PolicySettings
from geo_router.region_settings import RegionSettings
from geo_router.routing_settings import RoutingSettings
from servekit.config import Section
from servekit.peer_identity import IdentityUnusable, expected_name
from servekit.peers import PeerSettings
from servekit.registry.protocol import Tier
from servekit.registry.settings import RegistrySettings, StaticEntry
from servekit.tracing import TracingSettings

__all__ = [
    "ClassifierSettings",
    "PeersSettings",
    "RouterSettings",
    "ServerSettings",
    "UpstreamSettings",
]


class ClassifierSettings(Section):
    threshold: float = Field(
        0.5,
        ge=0.0,
        le=1.0,
        description="The dial: expected quality gap >= threshold goes to the center.",
    )
    weights: Path | None = Field(None, description="Task model JSON; the bundled one if unset.")
    policy: PolicySettings = Field(
        default_factory=PolicySettings, description="Task type, tenant, use case -> tier."
    )


class UpstreamSettings(StaticEntry):
    """A static instance by URL; ``model`` (and ``version``) may come from its ``/load``."""

    model: str = Field("", description="Served model; taken from /load when empty.")
    client: PeerSettings | None = Field(
        None, description="Token and TLS trust for this upstream (default: its tier's)."
    )


class PeersSettings(Section):
    """How the router calls edges and centers: service token, CA bundle, client cert."""

    default: PeerSettings = Field(default_factory=PeerSettings)
    edge: PeerSettings | None = Field(None, description="For edges, instead of `default`.")
    center: PeerSettings | None = Field(None, description="For centers, instead of `default`.")

    def for_tier(self, tier: Tier) -> PeerSettings:
        return (self.edge if tier == "edge" else self.center) or self.default


class ServerSettings(servekit.settings.ServerSettings):
    """The router's ``server:`` block: the shared one with the router's defaults."""

    max_body_bytes: int = Field(1_000_000, ge=1024, description="Larger bodies get 413.")
    log_level: servekit.settings.LogLevel = Field(
        "warning", description="Log level of the service's own logger."
    )


# Keys of the server block that older router files set at the top level.
_LEGACY_SERVER_KEYS = ("host", "port", "max_body_bytes", "tls", "graceful_shutdown_s")


class RouterSettings(Section):
    server: ServerSettings = Field(
        default_factory=ServerSettings,
        description="Where and how the router listens (older files: these keys at the top).",
    )
    auth: AuthSettings = Field(default_factory=AuthSettings)
    region: RegionSettings = Field(default_factory=RegionSettings)
    classifier: ClassifierSettings = Field(default_factory=ClassifierSettings)
    routing: RoutingSettings = Field(default_factory=RoutingSettings)
    upstreams: list[UpstreamSettings] = Field(
        default_factory=list,
        description="Instances by URL (the registry's static entries; /ready and /load polled).",
    )
    registry: RegistrySettings | None = Field(
        None, description="Discovery and canary shares through servekit.registry."
    )
    peers: PeersSettings = Field(
        default_factory=PeersSettings,
        description="Credentials and TLS trust for the upstream hop (per tier).",
    )
    poll_interval_s: float = Field(1.0, gt=0, description="Static probe and KV poll period.")
    traffic: dict[str, dict[str, float]] = Field(
        default_factory=dict,
        description="Static canary shares per model ({model: {version: share}}); KV wins.",
    )
    connect_timeout_s: float = Field(2.0, gt=0)
    feedback_log: Path | None = Field(
        None, description="Append users' ratings (POST /v1/feedback) to this JSON-lines file."
    )
    tracing: TracingSettings = Field(
        default_factory=TracingSettings, description="OpenTelemetry traces (off by default)."
    )

    @property
    def open_because(self) -> str | None:
        """Why anyone may call the router (None: an API key is required)."""
        return None if self.auth.required else "auth.required is false: anonymous callers served"

    @model_validator(mode="after")
    def _upstream_identities(self) -> RouterSettings:
        # Fail at start rather than refuse the upstream at every request.
        for u in self.upstreams:
            peer = u.client or self.peers.for_tier(u.tier)
            if peer.identity != "host" and not u.url.lower().startswith("https://"):
                raise ValueError(
                    f"upstream {u.url}: identity: {peer.identity} can only be checked over TLS;"
                    " give an https:// URL"
                )
            try:
                expected_name(peer.identity, peer.identity_domain, u.tier, u.id or u.url)
            except IdentityUnusable as exc:
                raise ValueError(
                    f"upstream {u.url}: {exc}; with identity: {peer.identity} give it an id"
                    " its certificate names"
                ) from None
        return self

    @model_validator(mode="before")
    @classmethod
    def _legacy_server_keys(cls, data: Any) -> Any:
        """Files written before the ``server:`` block still load; where a key is in both,
        ``server:`` wins (it is where a ``serve`` flag such as ``--port`` lands)."""
        if not isinstance(data, dict) or not any(k in data for k in _LEGACY_SERVER_KEYS):
            return data
        data = dict(data)
        server = dict(data.get("server") or {})
        for key in _LEGACY_SERVER_KEYS:
            if key in data:
                server.setdefault(key, data.pop(key))
        data["server"] = server
        return data
