"""The simulator's settings tree (YAML via ``servekit.config.load_settings``)."""

from __future__ import annotations

import bisect
import itertools
import math
import random
from typing import Any, Literal

from pydantic import BaseModel, Field, model_validator

from hybrid_llm.fleet.sim.profiles import PRESETS, EngineProfile
from hybrid_llm.fleet.sim.protection import EdgeProtection
from servekit.rtt import RttTable

__all__ = [
    "GPU_HOUR_USD",
    "CenterSpec",
    "LengthDist",
    "PolicyName",
    "PolicySpec",
    "RegionSpec",
    "SimConfig",
    "TracedRequest",
    "WarmState",
    "WorkloadSpec",
    "resolve_profile",
]

PolicyName = Literal["all-center", "hybrid", "hybrid-hedge"]

# On-demand list prices per GPU-hour, AWS us-east-1 (Linux). First quoted from
# memory; checked on 2026-12-03 against public third-party transcriptions of AWS's
# price list (no AWS page with these figures was found; check today's before buying):
# - L4: g6.xlarge (1 x L4, 4 vCPU, 16 GiB) $0.8048/h. Confirmed: github.com/tsaol/
#   aws-gpu, data/g6_instances.js (generated from instances.vantage.sh, "last
#   updated 2025-11-30"): g6.xlarge us-east-1 onDemand 0.8048.
# - H100: p5.48xlarge (8 x H100 SXM 80 GB) $98.32/h, i.e. $12.29 per GPU: the price
#   before AWS's mid-2025 P5 cut, kept so the sizing results already published stay
#   reproducible. It is still stated ("pricing data current as of Q1 2026") by
#   disintermediate.global/insights/gpu-cloud-pricing-models, but the newer listings
#   say $55.04/h, i.e. $6.88 per GPU: the same tsaol/aws-gpu, data/p5_instances.js
#   (2025-11-30), and github.com/datareceipts/data-receipts,
#   109-gpu-pricing/hyperscalers.json ("retrieved": "2026-11-09"). Price that with
#   `--gpu-price H100=6.88`.
# The instance price includes its CPUs, memory and disk, as a buyer pays it.
GPU_HOUR_USD: dict[str, float] = {"L4": 0.8048, "H100": 12.29}


def resolve_profile(value: str | EngineProfile) -> EngineProfile:
    if isinstance(value, EngineProfile):
        return value
    if value not in PRESETS:
        raise ValueError(f"unknown engine profile {value!r}; presets: {', '.join(PRESETS)}")
    return PRESETS[value]


class LengthDist(BaseModel):
    """Token-length distribution: ``fixed``, ``uniform``, ``lognormal`` (clamped) or
    ``quantiles`` (measured: ``(q, tokens)`` pairs from q = 0 to q = 1, drawn by
    inverse CDF, linear between them)."""

    kind: Literal["fixed", "uniform", "lognormal", "quantiles"] = "fixed"
    value: int = Field(128, ge=1)
    low: int = Field(1, ge=1)
    high: int = Field(256, ge=1)
    median: float = Field(128.0, gt=0)
    sigma: float = Field(0.6, ge=0)
    max: int = Field(8192, ge=1)
    quantiles: list[tuple[float, float]] = Field(
        default_factory=list, description="kind quantiles: (q, tokens), q rising from 0 to 1"
    )

    @model_validator(mode="after")
    def _check(self) -> LengthDist:
        if self.kind != "quantiles":
            return self
        qs = [q for q, _ in self.quantiles]
        values = [v for _, v in self.quantiles]
        if len(qs) < 2 or qs[0] != 0 or qs[-1] != 1 or qs != sorted(set(qs)):
            raise ValueError("quantiles need rising q from 0 to 1 (at least two pairs)")
        if values != sorted(values) or values[0] < 1:
            raise ValueError("quantiles need non-decreasing token counts of at least 1")
        return self

    def sample(self, rng: random.Random) -> int:
        if self.kind == "fixed":
            return self.value
        if self.kind == "uniform":
            return rng.randint(self.low, self.high)
        if self.kind == "quantiles":
            u = rng.random()
            i = min(
                max(bisect.bisect_right([q for q, _ in self.quantiles], u), 1),
                len(self.quantiles) - 1,
            )
            (q0, v0), (q1, v1) = self.quantiles[i - 1], self.quantiles[i]
            return max(1, min(self.max, round(v0 + (v1 - v0) * (u - q0) / (q1 - q0))))
        return max(1, min(self.max, round(rng.lognormvariate(math.log(self.median), self.sigma))))

    def mean(self) -> float:
        if self.kind == "fixed":
            return float(self.value)
        if self.kind == "uniform":
            return (self.low + self.high) / 2
        if self.kind == "quantiles":
            pairs = itertools.pairwise(self.quantiles)
            mean = sum((q1 - q0) * (v0 + v1) / 2 for (q0, v0), (q1, v1) in pairs)
            return min(float(self.max), mean)
        return min(float(self.max), self.median * math.exp(self.sigma**2 / 2))


class TracedRequest(BaseModel):
    """One request of a trace, as a bench measured it: when it arrived and its lengths."""

    at: float = Field(ge=0, description="seconds after warmup_s")
    prompt_tokens: int = Field(ge=1, description="the prompt as the engine counted it")
    output_tokens: int = Field(ge=1)
    cached_tokens: int = Field(
        0,
        ge=0,
        description="leading prompt tokens the engine found cached (a shared system prompt, "
        "a conversation's earlier turns); the chat template's preamble among them",
    )
    prefix: str | None = Field(
        None,
        description="what its cached tokens beyond the preamble are (a system prompt's or "
        "a conversation's name): only an instance that served a request leaving it holds "
        "them; None: every instance",
    )
    conversation: str | None = Field(
        None, description="the conversation it belongs to: the instance serving it holds it"
    )
    follows: int | None = Field(
        None,
        ge=0,
        description="index in the trace of the turn it answers: it is sent `gap_s` after "
        "that turn's answer reached the client (a chat client's next turn), not at `at`; "
        "if that turn failed, never",
    )
    gap_s: float = Field(0.0, ge=0, description="the client's pause after the previous answer")
    hard: bool | None = Field(
        None,
        description="the router judged it hard (a bench request served by the center); "
        "None: drawn at the workload's hard_fraction",
    )


class RegionSpec(BaseModel):
    name: str
    edges: int = Field(1, ge=0, description="edge nodes in this region")
    rate: float = Field(1.0, ge=0, description="requests per second from users here")
    arrivals: list[float] | None = Field(
        None,
        description="a trace instead of Poisson at `rate`: arrival times in seconds after "
        "warmup_s (e.g. a bench run's request starts)",
    )
    trace: list[TracedRequest] | None = Field(
        None,
        description="a trace with lengths instead of Poisson at `rate`: each request arrives "
        "at its time with its own prompt, cached and output tokens (e.g. every request of "
        "a bench run on a conversation workload)",
    )

    @model_validator(mode="after")
    def _one_trace(self) -> RegionSpec:
        if self.arrivals is not None and self.trace is not None:
            raise ValueError(f"region {self.name}: give arrivals or trace, not both")
        for i, traced in enumerate(self.trace or []):
            if traced.follows is not None and traced.follows >= i:
                raise ValueError(f"region {self.name}: trace[{i}] follows a later request")
        return self


class CenterSpec(BaseModel):
    region: str
    replicas: int = Field(1, ge=1)
    profile: str | EngineProfile = "h100x4-llama70b-fp8"


class WorkloadSpec(BaseModel):
    prompt_tokens: LengthDist = Field(default_factory=lambda: LengthDist(kind="fixed", value=200))
    output_tokens: LengthDist = Field(default_factory=lambda: LengthDist(kind="fixed", value=128))
    hard_fraction: float = Field(0.2, ge=0, le=1, description="share the router sends to center")
    cached_prefix_tokens: int = Field(
        0,
        ge=0,
        description="leading prompt tokens every request shares (a chat template's preamble): "
        "a batching engine copies them from another slot instead of prefilling them",
    )
    template_tokens: int = Field(
        0,
        ge=0,
        description="prompt tokens the client did not send (the chat template's): the router "
        "estimates a prompt's tokens from the client's text, without them",
    )
    followup_share: float = Field(
        0.0,
        ge=0,
        le=1,
        description="share of requests that continue a conversation: their prompt also "
        "carries `history_tokens` of earlier turns",
    )
    history_tokens: LengthDist | None = Field(
        None,
        description="earlier turns of a follow-up request, added to its prompt and held in "
        "the serving instance's prefix cache (the router keeps a conversation where its "
        "prefix lives), so they count as cached, not prefilled",
    )


class PolicySpec(BaseModel):
    name: PolicyName = "hybrid"
    hedge_after_ms: float = Field(150.0, gt=0, description="race a second candidate after this")
    router_overhead_ms: float = Field(1.0, ge=0, description="router's own cost per request")
    choices: int = Field(
        2, ge=1, description="edges sampled per region and request (a router scores all)"
    )
    router: dict[str, Any] = Field(
        default_factory=dict,
        description="geo_router RoutingSettings overrides (center_bias_ms, p2c_window_ms, ...)",
    )
    poll_interval_s: float = Field(
        1.0, gt=0, description="the router reads each instance's load report this often"
    )
    router_region: str | None = Field(
        None, description="where the router polls from (default: the first region)"
    )


class WarmState(BaseModel):
    """What an instance's engine reported before the simulated run (its history)."""

    ttft_p50_ms: float | None = None
    ttft_p95_ms: float | None = None
    samples: int = Field(0, ge=0, le=512, description="TTFTs in the engine's window")
    decode_tokens_per_s: float | None = Field(None, gt=0)
    prefill_tokens_per_s: float | None = Field(None, gt=0)
    busy_ms_per_seq: float | None = Field(None, ge=0, description="until measured in the run")


class SimConfig(BaseModel):
    """A fleet, its users and a routing policy."""

    rtt: RttTable = Field(default_factory=RttTable)
    regions: list[RegionSpec] = Field(min_length=1)
    edge_profile: str | EngineProfile = "l4-llama8b-awq"
    edge_protection: EdgeProtection = Field(
        default_factory=EdgeProtection,
        description="what every edge does to protect its TTFT (all off by default)",
    )
    center: CenterSpec
    workload: WorkloadSpec = Field(default_factory=WorkloadSpec)
    policy: PolicySpec = Field(default_factory=PolicySpec)
    warm: dict[str, WarmState] = Field(
        default_factory=dict,
        description="instance name (edge/<region>/<i>, center/<i>) -> its engine's state at t=0",
    )
    gpu_hour_usd: dict[str, float] = Field(
        default_factory=lambda: dict(GPU_HOUR_USD),
        description="GPU kind -> USD per GPU-hour (sizing's cost); defaults: AWS on-demand list",
    )
    duration_s: float = Field(60.0, gt=0, description="arrivals are generated for this long")
    warmup_s: float = Field(5.0, ge=0, description="arrivals before this are not measured")
    seed: int = 0

    @model_validator(mode="after")
    def _check(self) -> SimConfig:
        resolve_profile(self.edge_profile)
        resolve_profile(self.center.profile)
        if self.warmup_s >= self.duration_s:
            raise ValueError("warmup_s must be shorter than duration_s")
        return self

    @property
    def edge(self) -> EngineProfile:
        return resolve_profile(self.edge_profile)

    @property
    def center_profile(self) -> EngineProfile:
        return resolve_profile(self.center.profile)
