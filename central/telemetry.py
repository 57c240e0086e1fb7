"""Per-replica series on the gateway's ``/metrics`` (read from the pool at scrape time)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from central.pool import ReplicaPool

__all__ = ["ReplicaCollector"]


class ReplicaCollector(Collector):
    """``central_replica_*`` gauges and counters, one series per replica."""

    def __init__(self, pool: ReplicaPool, labels: Mapping[str, str]) -> None:
        self._pool = pool
        self._labels = dict(labels)

    def collect(self) -> Iterable[Metric]:
        names = [*self._labels, "replica", "kind"]
        base = list(self._labels.values())
        healthy = GaugeMetricFamily(
            "central_replica_healthy", "1 while the replica is in rotation.", labels=names
        )
        inflight = GaugeMetricFamily(
            "central_replica_inflight", "Requests the gateway has on the replica.", labels=names
        )
        running = GaugeMetricFamily(
            "central_replica_engine_running", "Running sequences the engine reports.", labels=names
        )
        waiting = GaugeMetricFamily(
            "central_replica_engine_waiting", "Waiting requests the engine reports.", labels=names
        )
        kv = GaugeMetricFamily(
            "central_replica_kv_cache_usage",
            "KV-cache fullness the engine reports (0-1).",
            labels=names,
        )
        served = CounterMetricFamily(
            "central_replica_requests", "Requests the replica started answering.", labels=names
        )
        restarts = CounterMetricFamily(
            "central_replica_restarts", "Times the replica process was restarted.", labels=names
        )
        for replica in self._pool.replicas:
            values = [*base, replica.name, replica.spec.kind]
            healthy.add_metric(values, int(replica.healthy))
            inflight.add_metric(values, replica.inflight)
            served.add_metric(values, replica.served)
            restarts.add_metric(values, replica.restarts)
            load = replica.load
            if load is not None:
                running.add_metric(values, load.running)
                waiting.add_metric(values, load.waiting)
                if load.kv_cache_usage is not None:
                    kv.add_metric(values, load.kv_cache_usage)
        retries = CounterMetricFamily(
            "central_dispatch_retries",
            "Requests re-sent to another replica after failing before their first token.",
            labels=list(self._labels),
        )
        retries.add_metric(base, self._pool.retries)
        yield from (healthy, inflight, running, waiting, kv, served, restarts, retries)
