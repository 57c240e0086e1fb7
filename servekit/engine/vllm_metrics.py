"""Reading a vLLM server's own load figures from its Prometheus ``/metrics``.

Gauges: ``vllm:num_requests_running``, ``vllm:num_requests_waiting`` and
``vllm:kv_cache_usage_perc`` (``vllm:gpu_cache_usage_perc`` before the V1
engine; either is read). Counters, summed over engines (data parallel):
prefix-cache queries and hits, speculative draft and accepted tokens.
"""

from __future__ import annotations

from dataclasses import dataclass

from prometheus_client.parser import text_string_to_metric_families

__all__ = ["VllmGauges", "parse_vllm_metrics"]

_RUNNING = "vllm:num_requests_running"
_WAITING = "vllm:num_requests_waiting"
_KV = ("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc")
_COUNTERS = {
    "vllm:prefix_cache_queries_total": "prefix_cache_queries",
    "vllm:prefix_cache_hits_total": "prefix_cache_hits",
    "vllm:spec_decode_num_draft_tokens_total": "spec_draft_tokens",
    "vllm:spec_decode_num_accepted_tokens_total": "spec_accepted_tokens",
}


@dataclass(frozen=True, slots=True)
class VllmGauges:
    running: int = 0
    waiting: int = 0
    kv_cache_usage: float | None = None
    prefix_cache_queries: int = 0
    prefix_cache_hits: int = 0
    spec_draft_tokens: int = 0
    spec_accepted_tokens: int = 0


def parse_vllm_metrics(text: str) -> VllmGauges:
    """Read vLLM's scheduler gauges and cache counters from its Prometheus exposition."""
    sums: dict[str, float] = {}
    kv: float | None = None
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            name = sample.name
            if name in (_RUNNING, _WAITING) or name in _COUNTERS:
                sums[name] = sums.get(name, 0.0) + sample.value
            elif name in _KV:
                # Several engines (data parallel) report one gauge each: the fullest counts.
                kv = sample.value if kv is None else max(kv, sample.value)
    if _RUNNING not in sums and _WAITING not in sums:
        raise ValueError("no vllm:num_requests_* gauges in the metrics text")
    counters = {field: round(sums.get(name, 0.0)) for name, field in _COUNTERS.items()}
    return VllmGauges(
        running=round(sums.get(_RUNNING, 0.0)),
        waiting=round(sums.get(_WAITING, 0.0)),
        kv_cache_usage=kv,
        **counters,
    )
