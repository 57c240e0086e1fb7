"""The router's settings tree, loaded once from YAML (``configs/router*.yaml``)."""

from __future__ import annotations

import ipaddress
from pathlib import Path
from typing import Any, Literal

from pydantic import Field, SecretStr, field_validator, model_validator

import servekit.settings
from geo_router.limits import LimitsSettings
from geo_router.policy import PolicySettings
from servekit import rtt
from servekit.config import Section
from servekit.peer_identity import IdentityUnusable, expected_name
from servekit.peers import PeerSettings
from servekit.registry.protocol import Tier
from servekit.registry.settings import RegistrySettings, StaticEntry
from servekit.secrets import SecretSettings
from servekit.service_auth import check_sha256_hex
from servekit.service_auth import hash_token as hash_key
from servekit.tracing import TracingSettings

__all__ = [
    "ApiKeySettings",
    "AuthSettings",
    "BreakerSettings",
    "ClassifierSettings",
    "GeoIPSettings",
    "HedgeSettings",
    "PeersSettings",
    "PredictionSettings",
    "PrefixCacheSettings",
    "RegionSettings",
    "RouterSettings",
    "RoutingSettings",
    "ServerSettings",
    "TrimSettings",
    "UpstreamSettings",
    "hash_key",
]


class ApiKeySettings(Section):
    sha256: str = Field(description="Hex sha256 of the key; the key itself is never stored.")
    tenant: str = Field(min_length=1)
    priority: Literal["interactive", "batch"] = "interactive"
    rpm: int | None = Field(None, ge=1, description="Requests per minute; unlimited if unset.")
    tpm: int | None = Field(None, ge=1, description="Tokens (prompt + max output) per minute.")
    burst_s: float = Field(
        60.0, gt=0, le=60, description="Seconds of the rate that may be spent at once."
    )
    max_streams: int | None = Field(
        None,
        ge=1,
        description="Requests in flight at once (per router); more answer 429 at once. A "
        "stream a client reads slowly holds an engine slot until it ends.",
    )
    stream_deadline_s: float | None = Field(
        None,
        gt=0,
        description="This key's answers end this long after their request arrived (a "
        "stream with an error event and [DONE]); unset: server.stream_deadline_s.",
    )
    operator: bool = Field(
        False,
        description="May see routing internals: /v1/route/explain and X-Route-Cached-Tokens. "
        "What an instance holds cached tells whether somebody (another tenant) sent a text "
        "recently, so tenants' keys do not.",
    )
    cache_scope: str | None = Field(
        None,
        min_length=1,
        max_length=256,
        description="Whose prefix caches this key's requests share. Unset: its tenant's "
        "own (every key of the tenant, no one else). A name: every key naming the same "
        "scope (e.g. `shared`, or a group of tenants with one long system prompt) shares "
        "one cache, so its prompts prefill once for all of them, and each of them can tell "
        "from cached_tokens and time to first token what the others recently sent.",
    )

    @field_validator("sha256")
    @classmethod
    def _hex(cls, value: str) -> str:
        return check_sha256_hex(value)


class AuthSettings(SecretSettings):
    secret_fields = ("cache_salt_key",)
    required: bool = Field(True, description="Reject requests without a configured key.")
    keys: list[ApiKeySettings] = Field(default_factory=list)
    cache_salt_key: SecretStr | None = Field(
        None,
        description="Key of the HMAC that turns a cache scope into the cache_salt sent "
        "upstream (better: cache_salt_key_file or cache_salt_key_env); the same on every "
        "router, or their tenants' caches split. Unset: a fixed key, so anyone who can "
        "call an engine directly could compute a tenant's salt (clients of the router "
        "cannot set cache_salt either way).",
    )
    anonymous_priority: Literal["interactive", "batch"] = "interactive"
    limits: LimitsSettings = Field(
        default_factory=LimitsSettings,
        description="Where rate-limit buckets live (per router, or Redis shared by all).",
    )


class GeoIPSettings(Section):
    database: Path = Field(description="GeoLite2/GeoIP2 City .mmdb file.")
    regions: dict[str, str] = Field(
        default_factory=dict,
        description="'CC-SUBDIVISION' or 'CC' (ISO codes) to region, most specific wins.",
    )


class RegionSettings(Section):
    default: str = "local"
    trusted_header: str = Field("X-Client-Region", description="Set by the load balancer.")
    trusted_proxies: list[str] = Field(
        default_factory=list, description="CIDRs whose region header and X-Forwarded-For count."
    )
    cidrs: dict[str, str] = Field(default_factory=dict, description="Client CIDR to region.")
    geoip: GeoIPSettings | None = None
    # The RTT table's fields under the router's own names (servekit.rtt.RttTable).
    rtt_ms: dict[str, dict[str, float]] = Field(
        default_factory=dict, description="RTT between regions; symmetric if one side is given."
    )
    same_region_rtt_ms: float = Field(rtt.SAME_REGION_MS, ge=0)
    unknown_rtt_ms: float = Field(rtt.DEFAULT_MS, ge=0)
    measured_rtt: bool = Field(
        False,
        description="Price users in the default region (the router's own) with the RTT the "
        "router measures to each instance on its /load polls (the minimum of the last 10) "
        "instead of the table, once one was measured; users elsewhere keep the table.",
    )

    def rtt_table(self) -> rtt.RttTable:
        return rtt.RttTable(
            rtt_ms=self.rtt_ms,
            same_region_ms=self.same_region_rtt_ms,
            default_ms=self.unknown_rtt_ms,
        )

    @field_validator("trusted_proxies")
    @classmethod
    def _proxies(cls, value: list[str]) -> list[str]:
        for cidr in value:
            ipaddress.ip_network(cidr, strict=False)
        return value

    @field_validator("cidrs")
    @classmethod
    def _cidrs(cls, value: dict[str, str]) -> dict[str, str]:
        for cidr in value:
            ipaddress.ip_network(cidr, strict=False)
        return value


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


class BreakerSettings(Section):
    failures: int = Field(3, ge=1, description="Consecutive failures that open the circuit.")
    open_s: float = Field(5.0, gt=0, description="How long an open circuit rejects traffic.")
    max_open_s: float = Field(60.0, gt=0, description="Cap of the doubling open time.")


class HedgeSettings(Section):
    enabled: bool = False
    min_delay_ms: float = Field(
        50.0, ge=0, description="The shortest hedge delay, however fast the prediction."
    )
    default_delay_ms: float = Field(
        500.0, ge=0, description="Used until the instance's TTFT is predicted or a P95 known."
    )


class PredictionSettings(Section):
    """The online TTFT predictor per instance (``geo_router.predictor``)."""

    enabled: bool = Field(
        True,
        description="False: every prediction is the scoring formula's, nothing learned "
        "(and the fixed hedge delay and first-token deadline throughout).",
    )
    min_samples: int = Field(
        10,
        ge=1,
        description="First tokens seen at an instance before its learned prediction replaces "
        "the formula's estimate (and drives its hedge delay and first-token deadline).",
    )
    forgetting: float = Field(
        0.98,
        gt=0.5,
        le=1.0,
        description="Per observation, the weight left to older ones (1: never forget).",
    )
    window: int = Field(
        50, ge=5, description="Recent actual/predicted ratios kept for the quantiles."
    )
    stale_half_life_s: float = Field(
        60.0,
        ge=0,
        description="With no first token seen there for this long, an instance's learned "
        "median has faded halfway back to the formula's (0: never fades).",
    )
    deadline_factor: float = Field(
        2.0,
        ge=1.0,
        description="A learned first-token deadline is this times the request's predicted P90.",
    )
    deadline_min_s: float = Field(
        1.0, gt=0, description="The shortest learned first-token deadline."
    )


class PrefixCacheSettings(Section):
    """The router's estimate of each instance's prefix cache (``geo_router.prefix_index``)."""

    enabled: bool = Field(True, description="Charge only the prompt an instance lacks cached.")
    block_chars: int = Field(64, ge=8, description="Characters per hashed block.")
    max_blocks: int = Field(
        8192, ge=1, description="Blocks remembered per instance (fewer when its KV holds less)."
    )
    ttl_s: float = Field(600.0, gt=0, description="Blocks unused this long count as evicted.")
    anchor_chars: int = Field(
        1024,
        ge=16,
        description="Opening characters that name a prefix new to every instance, for "
        "placing its first copy alike at every router (rendezvous hashing).",
    )


class TrimSettings(Section):
    """Trimming of long conversations for one tier (``geo_router.trimming``)."""

    enabled: bool = Field(False, description="Drop the oldest turns when a request does not fit.")
    last_resort: bool = Field(
        False,
        description="Trim only a conversation that no candidate of any tier can hold whole "
        "(otherwise: whenever it does not fit this tier).",
    )
    max_prompt_tokens: int | None = Field(
        None, ge=1, description="Trim prompts above this too (default: only what cannot fit)."
    )
    window_share: float = Field(
        0.8,
        gt=0,
        le=1,
        description="Trim to this share of the window: the router's token count is an "
        "estimate, and a trim that fills the window exactly may still overflow it.",
    )


class TierTrimming(Section):
    """A trimming policy per tier (none: that tier never trims)."""

    edge: TrimSettings | None = None
    center: TrimSettings | None = None

    def for_tier(self, tier: Tier) -> TrimSettings | None:
        return self.edge if tier == "edge" else self.center


class TrimmingSettings(TierTrimming):
    """Per tier, and per tenant (a tenant's tier entry replaces the default for it)."""

    tenants: dict[str, TierTrimming] = Field(
        default_factory=dict, description="Per tenant name (auth keys' `tenant`)."
    )

    def policy(self, tier: Tier, tenant: str | None = None) -> TrimSettings | None:
        own = self.tenants.get(tenant) if tenant is not None else None
        if own is not None and own.for_tier(tier) is not None:
            return own.for_tier(tier)
        return self.for_tier(tier)


class RoutingSettings(Section):
    aliases: dict[str, Tier | None] = Field(
        default_factory=lambda: {"auto": None, "edge": "edge", "center": "center"},
        description="Model names that route by tier (None: classify).",
    )
    ttft_deadline_s: float = Field(
        10.0,
        gt=0,
        description="First token or fail over, until the instance's TTFT is learned "
        "(then the request's predicted P90 sets it: prediction.deadline_factor).",
    )
    ttft_deadline_factor: float = Field(
        3.0,
        ge=1,
        description="The deadline of an attempt is at least this times its predicted TTFT: a "
        "long prompt priced at 15 s of prefill is not cut at ttft_deadline_s.",
    )
    request_timeout_s: float = Field(300.0, gt=0, description="Whole non-streamed request.")
    idle_timeout_s: float = Field(
        30.0,
        gt=0,
        description="Gap between an upstream's bytes once it sent its first (the wait for "
        "the first is the first-token deadline's, or request_timeout_s for the last candidate).",
    )
    max_attempts: int = Field(3, ge=1, description="Upstreams tried before the first byte.")
    max_continuations: int = Field(2, ge=0, description="Mid-stream resumptions per request.")
    p2c_window_ms: float = Field(
        25.0, ge=0, description="Candidates this close to the best compete by power of two."
    )
    center_bias_ms: float = Field(
        30.0, ge=0, description="Added to the center's predicted TTFT for simple requests."
    )
    busy_slowdown_weight: float = Field(
        1.0,
        ge=0,
        description="Per running sequence, this share of the engine's reported "
        "busy_ms_per_seq (what one running sequence added to its recent arrivals' TTFT) "
        "is added to its predicted TTFT (0: only queue wait counts).",
    )
    hard_may_use_edge: bool = Field(True, description="Hard requests fall back to edges.")
    slow_start_s: float = Field(30.0, ge=0, description="Weight ramp for new or recovered ones.")
    default_prefill_tps: dict[str, float] = Field(
        default_factory=lambda: {"edge": 400.0, "center": 4000.0}
    )
    default_service_ms: dict[str, float] = Field(
        default_factory=lambda: {"edge": 3000.0, "center": 1500.0},
        description="Typical request duration, for queue wait when no rate is reported.",
    )
    default_max_tokens: int = Field(
        256, ge=1, description="max_tokens written into a forwarded body that has none."
    )
    max_tokens_cap: int = Field(
        4096, ge=1, description="A larger max_tokens is lowered to this before forwarding."
    )
    shed_backoff_s: float = Field(
        0.5,
        ge=0,
        description="After an instance refused a request (429), how long it ranks behind "
        "candidates that can start in time.",
    )
    prefix_cache: PrefixCacheSettings = Field(default_factory=PrefixCacheSettings)
    trimming: TrimmingSettings = Field(
        default_factory=TrimmingSettings,
        description="Per tier and tenant: trim long histories to fit (opt-in).",
    )
    breaker: BreakerSettings = Field(default_factory=BreakerSettings)
    hedge: HedgeSettings = Field(default_factory=HedgeSettings)
    prediction: PredictionSettings = Field(default_factory=PredictionSettings)


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
