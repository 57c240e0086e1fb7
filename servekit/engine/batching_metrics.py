"""Prometheus series for the batching engine's scheduler, read at scrape time.

The shared serving metrics (:mod:`servekit.metrics`) already export what the
load report carries (running, waiting, prefix reuse). This collector adds what
only a batching engine has: batch sizes, decode steps and time inside
``llama_decode``. Register it on the app's own registry::

    registry.register(BatchingCollector(engine.stats, {"model": ..., "version": ...}))
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping

from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector

from servekit.engine.batching_stats import BATCH_SIZE_BUCKETS, BatchingSnapshot
from servekit.metrics import labelled_counter, labelled_gauge

__all__ = ["BatchingCollector"]


class BatchingCollector(Collector):
    """Scheduler figures of one batching engine, labelled like the serving metrics."""

    def __init__(self, snapshot: Callable[[], BatchingSnapshot], labels: Mapping[str, str]) -> None:
        self._snapshot = snapshot
        self._names = list(labels)
        self._values = [labels[n] for n in self._names]

    def collect(self) -> Iterable[Metric]:
        snap = self._snapshot()
        names, values = self._names, self._values

        def gauge(name: str, doc: str, value: float) -> GaugeMetricFamily:
            return labelled_gauge(name, doc, names, values, value)

        def counter(name: str, doc: str, value: float) -> CounterMetricFamily:
            return labelled_counter(name, doc, names, values, value)

        yield gauge("servekit:batch_slots", "Sequence slots of the batching engine.", snap.slots)
        yield gauge(
            "servekit:batch_last_sequences",
            "Sequences in the most recent decode step.",
            snap.last_batch_sequences,
        )
        yield gauge(
            "servekit:batch_last_tokens",
            "Tokens in the most recent decode step.",
            snap.last_batch_tokens,
        )
        if snap.busy_ms_per_seq is not None:
            yield gauge(
                "servekit:batch_busy_seconds_per_sequence",
                "What one running sequence adds to a new request's TTFT (the router's "
                "busy penalty per sequence), measured from recent admissions.",
                snap.busy_ms_per_seq / 1000.0,
            )
        yield counter("servekit:batch_steps", "llama_decode calls (steps).", snap.steps)
        yield counter(
            "servekit:batch_decode_seconds", "Time spent inside llama_decode.", snap.busy_seconds
        )
        yield counter(
            "servekit:batch_decode_tokens", "Generated tokens evaluated.", snap.decode_tokens
        )
        yield counter(
            "servekit:batch_prefill_tokens", "Prompt tokens evaluated.", snap.prefill_tokens
        )
        yield counter(
            "servekit:batch_prefix_copies",
            "Admissions that started from a copy of another slot's cached prefix.",
            snap.prefix_copies,
        )
        hist = HistogramMetricFamily(
            "servekit:batch_size_sequences",
            "Sequences per decode step.",
            labels=names,
        )
        counts = zip(BATCH_SIZE_BUCKETS, snap.batch_size_counts, strict=True)
        buckets = [(str(bound), float(count)) for bound, count in counts]
        buckets.append(("+Inf", float(snap.steps)))
        hist.add_metric(values, buckets, float(snap.batch_sequences_total))
        yield hist
