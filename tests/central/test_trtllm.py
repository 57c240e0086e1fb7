"""The gateway against trtllm-serve's real behaviour (an HTTP double written from
its source, tests/central/trtllm_double.py): slow JSON metrics, flat 400 error
bodies for engine failures, and its priority scale."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from central.app import create_app
from central.commands import Endpoint, build_plan, trtllm_options
from central.engines import http_engine
from central.scrape import ReplicaProbe
from central.settings import CentralSettings
from central.specs import TrtllmReplica
from hybrid_llm.local.servers import UvicornThread, wait_ready
from servekit.errors import InvalidRequest, error_from_body
from tests.central.trtllm_double import create_trtllm_double

MODEL = "big"


@pytest.fixture
def doubles() -> Iterator[tuple[UvicornThread, UvicornThread]]:
    with (
        UvicornThread(create_trtllm_double(MODEL)) as a,
        UvicornThread(create_trtllm_double(MODEL)) as b,
    ):
        yield a, b


def _gateway(tmp_path: Path, urls: list[str], **replica: object) -> CentralSettings:
    return CentralSettings.model_validate(
        {
            "model": MODEL,
            "replicas": [
                {
                    "name": f"t{i}",
                    "kind": "url",
                    "url": u,
                    "load_source": "trtllm",
                    "capacity": 4,
                    "can_continue": False,
                    **replica,
                }
                for i, u in enumerate(urls)
            ],
            "supervision": {
                "health_interval_s": 0.1,
                "scrape_interval_s": 0.1,
                "probe_timeout_s": 2.0,
                "log_dir": str(tmp_path),
            },
        }
    )


@pytest.mark.anyio
async def test_metrics_scrape_outlasts_trtllms_two_second_stats_wait(
    doubles: tuple[UvicornThread, UvicornThread],
) -> None:
    """With the gateway's 2 s probe timeout a plain scrape always times out; the
    trtllm endpoint's own timeout and slower interval read the (empty) stats."""
    url = doubles[0].url
    spec = TrtllmReplica(name="t", model="/m", gpus=[0])
    trt = build_plan(spec, port=1, model_name=MODEL, run_dir=Path("/run")).endpoint
    assert trt.load_timeout_s is not None
    assert trt.load_timeout_s > 2.0
    assert trt.load_interval_s is not None
    assert trt.load_interval_s > 2.0
    async with httpx.AsyncClient() as client:
        probe = ReplicaProbe(client, timeout_s=2.0)
        plain = Endpoint(url, MODEL, 4, "trtllm")
        assert await probe.load(plain) is None
        load = await probe.load(Endpoint(url, MODEL, 4, "trtllm", trtllm=True))
        assert load is not None
        assert (load.running, load.waiting) == (0, 0)


def test_flat_and_string_error_bodies_are_read() -> None:
    flat = {"object": "error", "message": "out of KV cache blocks", "type": "BadRequestError",
            "param": None, "code": 400}  # fmt: skip
    err = error_from_body(400, flat)
    assert isinstance(err, InvalidRequest)
    assert err.message == "out of KV cache blocks"
    assert error_from_body(400, {"error": "messages: Field required"}).message == (
        "messages: Field required"
    )


def test_an_engine_failure_400_is_retried_on_another_replica(
    tmp_path: Path, doubles: tuple[UvicornThread, UvicornThread]
) -> None:
    a, b = doubles
    with UvicornThread(create_app(_gateway(tmp_path, [a.url, b.url]))) as gw:
        wait_ready(gw.url, timeout=15)
        httpx.post(a.url + "/fail", params={"n": 100})  # replica a's engine keeps failing
        for i in range(10):
            body = {"model": MODEL, "messages": [{"role": "user", "content": f"hi {i}"}]}
            r = httpx.post(gw.url + "/v1/chat/completions", json=body, timeout=30)
            assert r.status_code == 200, r.text
            assert r.json()["choices"][0]["message"]["content"] == "Hello from trt"
        tried_a = 100 - httpx.get(a.url + "/state").json()["fail"]
        assert tried_a >= 1  # requests did land on a, got its 400, and were re-sent
        assert httpx.get(b.url + "/state").json()["served"] == 10
        # A request every replica refuses is the request's fault: the client gets the 400.
        httpx.post(a.url + "/fail", params={"n": 0})
        body = {"model": MODEL, "messages": [{"role": "user", "content": "REJECT this"}]}
        r = httpx.post(gw.url + "/v1/chat/completions", json=body, timeout=30)
        assert r.status_code == 400
        assert r.json()["error"]["message"] == "The prompt is longer than max_seq_len (8192)"


def test_priority_is_sent_in_tensorrt_llms_scale(
    tmp_path: Path, doubles: tuple[UvicornThread, UvicornThread]
) -> None:
    a = doubles[0]
    settings = _gateway(tmp_path, [a.url], send_priority=True)
    with UvicornThread(create_app(settings)) as gw:
        wait_ready(gw.url, timeout=15)
        for priority in ("interactive", "batch"):
            body = {"model": MODEL, "prompt": "hi", "max_tokens": 3}
            r = httpx.post(gw.url + "/v1/completions", json=body, timeout=30,
                           headers={"X-Priority": priority})  # fmt: skip
            assert r.status_code == 200
    # Higher is served first in TensorRT-LLM; 0.5 is its default (Request::kDefaultPriority).
    assert httpx.get(a.url + "/priorities").json() == [0.5, 0.0]


def test_kv_cache_memory_fraction_is_written_inside_the_options_file() -> None:
    """Older trtllm-serve ignores --kv_cache_free_gpu_memory_fraction when the options
    file has a kv_cache_config block; the fraction goes into that block instead."""
    spec = TrtllmReplica(
        name="t", model="/m", gpus=[0], kv_cache_free_gpu_memory_fraction=0.85,
        kv_cache_dtype="fp8",
    )  # fmt: skip
    plan = build_plan(spec, port=8000, model_name=MODEL, run_dir=Path("/run"))
    assert "--kv_cache_free_gpu_memory_fraction" not in plan.argv
    assert trtllm_options(spec)["kv_cache_config"] == {
        "free_gpu_memory_fraction": 0.85,
        "dtype": "fp8",
    }


def test_the_cache_salt_goes_to_vllm_replicas_not_to_trtllm_serve() -> None:
    # trtllm-serve's request models forbid undeclared fields: a salt would be a 400.
    vllm = http_engine(Endpoint("http://127.0.0.1:1", "m", 1, "vllm"))
    trtllm = http_engine(Endpoint("http://127.0.0.1:1", "m", 1, "trtllm", trtllm=True))
    assert vllm.settings.send_cache_salt
    assert not trtllm.settings.send_cache_salt
