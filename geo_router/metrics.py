"""The router's Prometheus metrics, on a registry of its own (one per app)."""

from __future__ import annotations

from collections.abc import Iterable

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

__all__ = ["RouterMetrics"]

_LATENCY = (0.005, 0.01, 0.025, 0.05, 0.1, 0.2, 0.3, 0.5, 0.75, 1.0, 2.0, 5.0, 10.0, 30.0)
_RATIO = (0.25, 0.5, 0.67, 0.8, 0.9, 1.0, 1.1, 1.25, 1.5, 2.0, 3.0, 5.0, 10.0)
_FAST = (0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1)


class RouterMetrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.decisions = Counter(
            "router_decisions_total",
            "Routed requests by chosen tier, user region and reason.",
            ["tier", "region", "reason"],
            registry=r,
        )
        self.fallbacks = Counter(
            "router_fallbacks_total",
            "Attempts abandoned for another candidate, by failed tier and cause.",
            ["tier", "cause"],
            registry=r,
        )
        self.hedges = Counter(
            "router_hedges_total", "Hedged attempts by outcome.", ["outcome"], registry=r
        )
        self.continuations = Counter(
            "router_continuations_total",
            "Mid-stream resumptions on another instance, by outcome.",
            ["outcome"],
            registry=r,
        )
        self.circuit = Gauge(
            "router_circuit_state",
            "Circuit per instance: 0 closed, 1 half-open, 2 open.",
            ["instance"],
            registry=r,
        )
        self.candidates = Gauge(
            "router_candidates", "Healthy instances known, by tier.", ["tier"], registry=r
        )
        self.limits_fallback = Gauge(
            "router_limits_fallback",
            "1 while the shared limits backend is unreachable and this router enforces "
            "its share (1/routers) of each limit alone.",
            registry=r,
        )
        self.catalog_stale = Gauge(
            "router_catalog_stale",
            "1 while the registry is unreachable and the last-known catalog is used.",
            registry=r,
        )
        self.overhead = Histogram(
            "router_added_latency_seconds",
            "Time the router adds before the first byte (TTFT minus the upstream's).",
            buckets=_FAST,
            registry=r,
        )
        self.ttft = Histogram(
            "router_time_to_first_token_seconds",
            "TTFT seen by clients.",
            ["tier", "region"],
            buckets=_LATENCY,
            registry=r,
        )
        self.itl = Histogram(
            "router_inter_token_latency_seconds",
            "Gap between streamed chunks.",
            ["tier", "region"],
            buckets=_LATENCY,
            registry=r,
        )
        self.e2e = Histogram(
            "router_e2e_request_latency_seconds",
            "Whole request duration.",
            ["tier", "region"],
            buckets=_LATENCY,
            registry=r,
        )
        self.stages = Histogram(
            "router_stage_seconds",
            "Time in each stage before the first token (the Server-Timing stages: auth, "
            "body, limit, region, classify, plan, upstream).",
            ["stage"],
            buckets=(*_FAST, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0),
            registry=r,
        )
        self._stage: dict[str, Histogram] = {}  # children bound once: no label lookup per request
        self.prediction = Histogram(
            "router_ttft_prediction_ratio",
            "Upstream TTFT over its predicted median, per primed attempt, by tier and "
            "whether the prediction was learned or the formula's (1 is exact, above 1 late).",
            ["tier", "source"],
            buckets=_RATIO,
            registry=r,
        )
        self.rejected = Counter(
            "router_rejected_total",
            "Requests refused before routing, by status code.",
            ["code"],
            registry=r,
        )

    def observe_stages(self, stages: Iterable[tuple[str, float, float]]) -> None:
        """One request's stages (``geo_router.stages``) into ``router_stage_seconds``."""
        bound = self._stage
        for name, began, ended in stages:
            child = bound.get(name)
            if child is None:
                child = bound[name] = self.stages.labels(name)
            child.observe(ended - began)

    def render(self) -> bytes:
        return generate_latest(self.registry)
