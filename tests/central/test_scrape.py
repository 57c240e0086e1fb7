"""Reading vLLM, TensorRT-LLM and stand-in load through the real probe code.

The engines are doubled at the transport (httpx.MockTransport) with bodies in
the shape their servers produce.
"""

from __future__ import annotations

import httpx
import pytest

from central.commands import Endpoint
from central.scrape import ReplicaProbe, parse_trtllm_stats, parse_vllm_metrics
from servekit.engine.protocol import LoadReport

VLLM_V1_METRICS = """\
# HELP vllm:num_requests_running Number of requests in model execution batches.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="qwen2.5-72b-instruct"} 7.0
# HELP vllm:num_requests_waiting Number of requests waiting to be processed.
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{engine="0",model_name="qwen2.5-72b-instruct"} 3.0
# HELP vllm:kv_cache_usage_perc KV-cache usage. 1 means 100 percent usage.
# TYPE vllm:kv_cache_usage_perc gauge
vllm:kv_cache_usage_perc{engine="0",model_name="qwen2.5-72b-instruct"} 0.42
# HELP vllm:time_to_first_token_seconds Histogram of time to first token in seconds.
# TYPE vllm:time_to_first_token_seconds histogram
vllm:time_to_first_token_seconds_bucket{engine="0",le="0.1",model_name="q"} 5.0
vllm:time_to_first_token_seconds_bucket{engine="0",le="+Inf",model_name="q"} 9.0
vllm:time_to_first_token_seconds_count{engine="0",model_name="q"} 9.0
vllm:time_to_first_token_seconds_sum{engine="0",model_name="q"} 1.5
"""

VLLM_V0_METRICS = """\
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{model_name="m"} 2.0
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{model_name="m"} 0.0
# TYPE vllm:gpu_cache_usage_perc gauge
vllm:gpu_cache_usage_perc{model_name="m"} 0.9
"""

TRTLLM_STATS = [
    {"iter": 10, "numActiveRequests": 1, "numQueuedRequests": 0},
    {
        "iter": 11,
        "gpuMemUsage": 56401920000,
        "iterLatencyMS": 16.5,
        "numActiveRequests": 12,
        "numQueuedRequests": 4,
        "maxNumActiveRequests": 256,
        "inflightBatchingStats": {"numContextRequests": 2, "numGenRequests": 10},
        "kvCacheStats": {
            "maxNumBlocks": 1000,
            "freeNumBlocks": 250,
            "usedNumBlocks": 750,
            "tokensPerBlock": 32,
        },
    },
]


def test_vllm_v1_gauges() -> None:
    load = parse_vllm_metrics(VLLM_V1_METRICS)
    assert (load.running, load.waiting, load.kv_cache_usage) == (7, 3, 0.42)


def test_vllm_v0_cache_gauge_name() -> None:
    load = parse_vllm_metrics(VLLM_V0_METRICS)
    assert (load.running, load.waiting, load.kv_cache_usage) == (2, 0, 0.9)


def test_vllm_data_parallel_engines_add_up() -> None:
    text = VLLM_V1_METRICS + VLLM_V1_METRICS.replace('engine="0"', 'engine="1"').replace(
        "0.42", "0.6"
    )
    # Two families of the same name in one exposition are still read.
    load = parse_vllm_metrics(text)
    assert (load.running, load.waiting) == (14, 6)
    assert load.kv_cache_usage == 0.6


def test_not_vllm_metrics() -> None:
    with pytest.raises(ValueError, match="no vllm:num_requests"):
        parse_vllm_metrics("# TYPE up gauge\nup 1.0\n")


def test_trtllm_latest_iteration() -> None:
    load = parse_trtllm_stats(TRTLLM_STATS)
    assert (load.running, load.waiting, load.kv_cache_usage) == (12, 4, 0.75)


def test_trtllm_free_blocks_only_and_idle() -> None:
    stats = [{"numActiveRequests": 1, "kvCacheStats": {"maxNumBlocks": 10, "freeNumBlocks": 8}}]
    assert parse_trtllm_stats(stats).kv_cache_usage == pytest.approx(0.2)
    idle = parse_trtllm_stats([])
    assert (idle.running, idle.waiting, idle.kv_cache_usage) == (0, 0, None)
    with pytest.raises(ValueError, match="JSON list"):
        parse_trtllm_stats({"not": "a list"})


def _handler(request: httpx.Request) -> httpx.Response:
    host, path = request.url.host, request.url.path
    if host == "down":
        raise httpx.ConnectError("refused", request=request)
    if path == "/health":
        return httpx.Response(200 if host != "sick" else 503)
    if host == "vllm" and path == "/metrics":
        return httpx.Response(200, text=VLLM_V1_METRICS)
    if host == "trt" and path == "/metrics":
        return httpx.Response(200, json=TRTLLM_STATS)
    if host == "edge" and path == "/load":
        return httpx.Response(200, json=LoadReport(ready=True, waiting=2, running=1).to_dict())
    if host == "garbage":
        return httpx.Response(200, content=b"{not json")
    return httpx.Response(404)


def _ep(host: str, source: str) -> Endpoint:
    return Endpoint(f"http://{host}", "m", 4, source)  # type: ignore[arg-type]


@pytest.mark.anyio
async def test_probe_reads_each_engine_kind() -> None:
    async with httpx.AsyncClient(transport=httpx.MockTransport(_handler)) as client:
        probe = ReplicaProbe(client)
        vllm = await probe.load(_ep("vllm", "vllm"))
        assert vllm is not None
        assert (vllm.running, vllm.waiting) == (7, 3)
        trt = await probe.load(_ep("trt", "trtllm"))
        assert trt is not None
        assert trt.kv_cache_usage == 0.75
        edge = await probe.load(_ep("edge", "load"))
        assert edge is not None
        assert edge.report is not None
        assert (edge.running, edge.waiting, edge.report.ready) == (1, 2, True)
        assert await probe.load(_ep("x", "none")) is None


@pytest.mark.anyio
async def test_probe_failures_are_answers_not_exceptions() -> None:
    async with httpx.AsyncClient(transport=httpx.MockTransport(_handler)) as client:
        probe = ReplicaProbe(client)
        assert await probe.healthy(_ep("vllm", "vllm")) is True
        assert await probe.healthy(_ep("sick", "vllm")) is False
        assert await probe.healthy(_ep("down", "vllm")) is False
        assert await probe.load(_ep("down", "vllm")) is None
        assert await probe.load(_ep("garbage", "trtllm")) is None
        assert await probe.load(_ep("nothing", "vllm")) is None
