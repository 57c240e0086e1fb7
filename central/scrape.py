"""Reading a replica's health and load over HTTP, whatever engine it runs.

- vLLM: Prometheus text at ``/metrics``: ``vllm:num_requests_running``,
  ``vllm:num_requests_waiting`` and ``vllm:kv_cache_usage_perc`` (called
  ``vllm:gpu_cache_usage_perc`` before the V1 engine; either is read).
- TensorRT-LLM: ``trtllm-serve``'s ``/metrics`` returns a JSON list of the
  iteration stats gathered since the previous call (``numActiveRequests``,
  ``numQueuedRequests``, ``kvCacheStats``); an empty list means the engine
  did not step, i.e. it is idle.
- The stand-in (edge agent): its ``/load`` JSON, a :class:`LoadReport`.

Each page is fetched, timed out and its failures mapped by
:func:`servekit.load_reading.read_load_page`, as every reader of an
instance's load does, and the health check by
:func:`servekit.health_probe.probe_health`, as every "is it up?" is; here
they end: a probe that cannot read its replica says so with a ``False`` or
``None``, never an exception.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import httpx

from central.commands import Endpoint, LoadSource
from servekit.engine.protocol import LoadReport
from servekit.engine.vllm_metrics import parse_vllm_metrics as parse_vllm_gauges
from servekit.errors import ServeError
from servekit.health_probe import probe_health
from servekit.load_reading import load_report_from, read_load_page
from servekit.peers import PeerProblems

__all__ = ["ReplicaLoad", "ReplicaProbe", "parse_trtllm_stats", "parse_vllm_metrics"]

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class ReplicaLoad:
    """What a replica's engine says about its own load."""

    running: int = 0
    waiting: int = 0
    kv_cache_usage: float | None = None
    report: LoadReport | None = None

    @classmethod
    def of(cls, report: LoadReport) -> ReplicaLoad:
        """The load a replica's own report gives."""
        return cls(running=report.running, waiting=report.waiting, report=report)


def parse_vllm_metrics(text: str) -> ReplicaLoad:
    """Read vLLM's scheduler gauges (the shared parser, :mod:`servekit.engine.vllm_metrics`)."""
    gauges = parse_vllm_gauges(text)
    return ReplicaLoad(gauges.running, gauges.waiting, gauges.kv_cache_usage)


def parse_trtllm_stats(stats: Any) -> ReplicaLoad:
    """Read the latest of trtllm-serve's iteration stats."""
    if not isinstance(stats, list):
        raise ValueError("trtllm /metrics must be a JSON list of iteration stats")
    if not stats:
        return ReplicaLoad()
    last = stats[-1]
    if not isinstance(last, dict):
        raise ValueError("trtllm iteration stats must be JSON objects")
    kv_usage: float | None = None
    kv = last.get("kvCacheStats")
    if isinstance(kv, dict):
        total = _num(kv.get("maxNumBlocks"))
        used = _num(kv.get("usedNumBlocks"))
        if used is None and total is not None:
            free = _num(kv.get("freeNumBlocks"))
            used = None if free is None else total - free
        if total and used is not None:
            kv_usage = max(0.0, min(1.0, used / total))
    return ReplicaLoad(
        running=int(_num(last.get("numActiveRequests")) or 0),
        waiting=int(_num(last.get("numQueuedRequests")) or 0),
        kv_cache_usage=kv_usage,
    )


def _num(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value)


# Where each kind of replica tells its load, and how it is read.
_PAGES: dict[LoadSource, tuple[str, Callable[[httpx.Response], ReplicaLoad]]] = {
    "vllm": ("/metrics", lambda r: parse_vllm_metrics(r.text)),
    "trtllm": ("/metrics", lambda r: parse_trtllm_stats(r.json())),
    "load": ("/load", lambda r: ReplicaLoad.of(load_report_from(r))),
}


class ReplicaProbe:
    """Health checks and load scrapes over one shared client."""

    def __init__(self, client: httpx.AsyncClient, timeout_s: float = 2.0) -> None:
        self._client = client
        self._timeout = timeout_s
        self._problems = PeerProblems(log)

    async def healthy(self, endpoint: Endpoint) -> bool:
        url = endpoint.base_url + endpoint.health_path
        # A wrong CA bundle or token is said once (self._problems).
        health = await probe_health(
            self._client, url, timeout_s=self._timeout, problems=self._problems
        )
        return health.up

    async def load(self, endpoint: Endpoint) -> ReplicaLoad | None:
        """The replica's current load, or None when it cannot be read."""
        page = _PAGES.get(endpoint.load_source)
        if page is None:
            return None
        path, parse = page
        timeout = endpoint.load_timeout_s or self._timeout
        try:
            return await read_load_page(
                self._client, endpoint.base_url + path, parse, timeout_s=timeout
            )
        except ServeError as exc:
            log.debug("load scrape of %s failed: %s", endpoint.base_url, exc)
            return None
