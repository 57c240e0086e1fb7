"""Prometheus metrics shared by the serving tiers (edge agent, central gateway).

Names follow vLLM's where one exists (``vllm:time_to_first_token_seconds``
and friends) so existing dashboards work; every series carries ``model``,
``version``, ``region`` and ``tier`` labels. Each app owns its own
:class:`~prometheus_client.CollectorRegistry`; nothing is global.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from servekit.connection_guard import CLOSE_REASONS, CloseReason
from servekit.engine.protocol import LoadReport

__all__ = [
    "LATENCY_BUCKETS",
    "GuardMetrics",
    "ServingMetrics",
    "labelled_counter",
    "labelled_gauge",
]

LATENCY_BUCKETS = (
    0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.15, 0.2, 0.3, 0.5, 0.75,
    1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0,
)  # fmt: skip
ITL_BUCKETS = (
    0.001, 0.0025, 0.005, 0.01, 0.015, 0.02, 0.025, 0.03, 0.04, 0.05, 0.075,
    0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5,
)  # fmt: skip
LABELS = ("model", "version", "region", "tier")


def labelled_gauge(
    name: str, doc: str, labels: dict[str, str] | list[str], values: list[str], value: float
) -> GaugeMetricFamily:
    """One gauge sample with the instance's labels, for custom collectors."""
    fam = GaugeMetricFamily(name, doc, labels=list(labels))
    fam.add_metric(values, value)
    return fam


def labelled_counter(
    name: str, doc: str, labels: dict[str, str] | list[str], values: list[str], value: float
) -> CounterMetricFamily:
    """One counter sample with the instance's labels, for custom collectors."""
    fam = CounterMetricFamily(name, doc, labels=list(labels))
    fam.add_metric(values, value)
    return fam


class _LoadCollector(Collector):
    """Engine-reported counters and gauges, read from the load report at scrape time."""

    def __init__(self, load: Callable[[], LoadReport], labels: dict[str, str]) -> None:
        self._load = load
        self.labels = labels

    def collect(self) -> Iterable[Metric]:
        report = self._load()
        names = list(self.labels)
        values = [self.labels[n] for n in names]

        def counter(name: str, doc: str, value: float) -> CounterMetricFamily:
            return labelled_counter(name, doc, names, values, value)

        def gauge(name: str, doc: str, value: float) -> GaugeMetricFamily:
            return labelled_gauge(name, doc, names, values, value)

        yield gauge("vllm:num_requests_running", "Requests running on the engine.", report.running)
        yield gauge("vllm:num_requests_waiting", "Requests admitted, waiting.", report.waiting)
        yield counter(
            "vllm:prefix_cache_queries",
            "Prompt tokens looked up in the prefix cache.",
            report.prefix_cache_query_tokens,
        )
        yield counter(
            "vllm:prefix_cache_hits",
            "Prompt tokens served from the prefix cache.",
            report.prefix_cache_hit_tokens,
        )
        yield counter(
            "vllm:spec_decode_num_draft_tokens",
            "Draft tokens proposed by speculative decoding.",
            report.spec_draft_tokens,
        )
        yield counter(
            "vllm:spec_decode_num_accepted_tokens",
            "Draft tokens accepted by speculative decoding.",
            report.spec_accepted_tokens,
        )
        if report.decode_tokens_per_s is not None:
            yield gauge(
                "hybrid_decode_tokens_per_second",
                "Recent per-sequence decode rate.",
                report.decode_tokens_per_s,
            )
        if report.ttft_budget_ms is not None:
            yield gauge(
                "servekit:ttft_budget_seconds",
                "Predicted waits above this are refused with 429 (TTFT-budget admission).",
                report.ttft_budget_ms / 1000.0,
            )
        if report.predicted_wait_ms is not None:
            yield gauge(
                "servekit:predicted_wait_seconds",
                "Predicted wait of a request arriving now, before its own prefill.",
                report.predicted_wait_ms / 1000.0,
            )
        if report.max_context_tokens is not None:
            yield gauge(
                "servekit:max_context_tokens",
                "Longest request (prompt + completion) the instance holds.",
                report.max_context_tokens,
            )
        yield gauge("hybrid_ready", "1 when the instance serves traffic.", int(report.ready))
        yield gauge("hybrid_draining", "1 while draining before stop.", int(report.draining))


class ServingMetrics:
    """The metrics one serving instance exports."""

    def __init__(
        self,
        registry: CollectorRegistry,
        *,
        model: str,
        version: str,
        region: str,
        tier: str,
        load: Callable[[], LoadReport],
    ) -> None:
        self.registry = registry
        self.labels = {"model": model, "version": version, "region": region, "tier": tier}
        self._ttft = Histogram(
            "vllm:time_to_first_token_seconds",
            "Time from request arrival to first output token.",
            LABELS,
            buckets=LATENCY_BUCKETS,
            registry=registry,
        )
        self._itl = Histogram(
            "vllm:inter_token_latency_seconds",
            "Time between consecutive output tokens.",
            LABELS,
            buckets=ITL_BUCKETS,
            registry=registry,
        )
        self._e2e = Histogram(
            "vllm:e2e_request_latency_seconds",
            "Time from request arrival to its last token.",
            LABELS,
            buckets=LATENCY_BUCKETS,
            registry=registry,
        )
        self._queue_time = Histogram(
            "vllm:request_queue_time_seconds",
            "Time a request waited for admission.",
            LABELS,
            buckets=LATENCY_BUCKETS,
            registry=registry,
        )
        self._prompt_tokens = Counter(
            "vllm:prompt_tokens", "Prompt tokens processed.", LABELS, registry=registry
        )
        self._generation_tokens = Counter(
            "vllm:generation_tokens", "Tokens generated.", LABELS, registry=registry
        )
        self._success = Counter(
            "vllm:request_success",
            "Requests finished, by finish reason.",
            (*LABELS, "finished_reason"),
            registry=registry,
        )
        self._outcomes = Counter(
            "hybrid_requests",
            "Requests by outcome: ok, client_error, rejected, cancelled, deadline, error.",
            (*LABELS, "outcome"),
            registry=registry,
        )
        self._load_collector = _LoadCollector(load, self.labels)
        registry.register(self._load_collector)
        self._bind()

    def _bind(self) -> None:
        lv = self.labels
        self.ttft = self._ttft.labels(**lv)
        self.itl = self._itl.labels(**lv)
        self.e2e = self._e2e.labels(**lv)
        self.queue_time = self._queue_time.labels(**lv)
        self.prompt_tokens = self._prompt_tokens.labels(**lv)
        self.generation_tokens = self._generation_tokens.labels(**lv)

    def set_version(self, version: str) -> None:
        """New series carry ``version``; the old version's series stay as they were."""
        self.labels = {**self.labels, "version": version}
        self._load_collector.labels = self.labels
        self._bind()

    def finished(self, reason: str) -> None:
        self._success.labels(**self.labels, finished_reason=reason).inc()

    def outcome(self, outcome: str) -> None:
        self._outcomes.labels(**self.labels, outcome=outcome).inc()


class GuardMetrics:
    """What the connection guards closed (:mod:`servekit.connection_guard`), on a registry
    of its own: every service (router, edge, center) serves it beside its own metrics."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self._closed = Counter(
            "hybrid_connections_closed",
            "Connections the server's guards closed, by reason: send_stall (the client took "
            "no bytes for server.send_stall_s), header_timeout (408), header_too_large (431), "
            "too_many_connections (503).",
            ["reason"],
            registry=self.registry,
        )
        for reason in CLOSE_REASONS:  # every reason shows, at 0 until it happens
            self._closed.labels(reason)

    def closed(self, reason: CloseReason) -> None:
        self._closed.labels(reason).inc()
