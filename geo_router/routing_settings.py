"""The router's ``routing:`` block: how candidates are priced, chosen and tried
(:mod:`geo_router.scoring`, :mod:`geo_router.planner`, :mod:`geo_router.attempt`).

Its sub-blocks configure one component each: the circuit breaker, hedging,
the TTFT predictor, the prefix-cache estimate and the trimming of long
conversations.
"""

from __future__ import annotations

from pydantic import Field

from servekit.config import Section
from servekit.registry.protocol import Tier

__all__ = [
    "BreakerSettings",
    "HedgeSettings",
    "PredictionSettings",
    "PrefixCacheSettings",
    "RoutingSettings",
    "TrimSettings",
]


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
