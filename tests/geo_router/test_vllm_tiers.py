"""The router in front of both tiers on real vLLM: an edge agent serving through
its own `vllm serve`, and the central gateway over one `vllm serve` replica
(two vLLM servers in all, each on a core of its own)."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from typing import Any

import httpx
import openai
import pytest
import yaml

from geo_router.app import create_app
from hybrid_llm.local.servers import REPO, UvicornThread, free_port, wait_ready
from tests.geo_router.conftest import KEY, router_settings, upstream
from tests.support.vllm import (
    HF_MODEL,
    VLLM,
    require_vllm,
    sdk_stream,
    vllm_engine,
    write_edge_config,
)

pytestmark = [pytest.mark.vllm, pytest.mark.slow]


@contextlib.contextmanager
def _services(commands: list[list[str]], urls: list[str]) -> Iterator[None]:
    """Start every service at once (their vLLM servers load side by side), wait for all."""
    env = dict(os.environ, PYTHONPATH=str(REPO))
    procs = [
        subprocess.Popen([sys.executable, "-m", *c], cwd=REPO, env=env, start_new_session=True)
        for c in commands
    ]
    try:
        for proc, url in zip(procs, urls, strict=True):
            try:
                wait_ready(url, timeout=450)
            except TimeoutError:
                raise RuntimeError(f"{url} not ready (exit code {proc.poll()})") from None
        yield
    finally:
        for proc in procs:
            proc.send_signal(signal.SIGTERM)
        for proc in procs:
            try:
                proc.wait(60)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()


@pytest.fixture(scope="module")
def tiers(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, str]]:
    require_vllm()
    tmp = tmp_path_factory.mktemp("vllm-tiers")
    edge_port, center_port = free_port(), free_port()
    edge_config = write_edge_config(
        tmp / "edge.yaml",
        edge_port,
        vllm_engine(tmp / "edge", cpu_threads_bind="0"),
        instance={"id": "edge-east", "region": "east", "version": "v1"},
    )
    center = yaml.safe_load((REPO / "configs" / "central-vllm-cpu.yaml").read_text())
    replica: dict[str, Any] = center["replicas"][1]  # the one bound to core 1
    replica.update(executable=str(VLLM), model=str(HF_MODEL), cache_dir=str(tmp / "center"))
    supervision = {"log_dir": str(tmp / "center-logs"), "health_interval_s": 0.5}
    center.update(replicas=[replica], supervision=supervision)
    center.pop("registry")
    center_config = tmp / "center.yaml"
    center_config.write_text(yaml.safe_dump(center))
    edge_url = f"http://127.0.0.1:{edge_port}"
    center_url = f"http://127.0.0.1:{center_port}"
    commands = [
        ["edge_agent", "serve", "--config", str(edge_config)],
        ["central", "serve", "--config", str(center_config), "--port", str(center_port)],
    ]
    with _services(commands, [edge_url, center_url]):
        # Both tiers run the same model on equal cores, so their measured speeds
        # differ by noise; a bias that dwarfs it makes a live edge the clear pick
        # for simple requests (what these tests check is reaching each tier and
        # falling back, not how two equal engines rank).
        settings = router_settings(
            [
                upstream(edge_url, tier="edge", region="east", id="edge-east"),
                upstream(center_url, tier="center", region="center", id="center"),
            ],
            routing={"center_bias_ms": 60_000.0},
        )
        with UvicornThread(create_app(settings)) as router:
            yield {"router": router.url, "edge": edge_url, "center": center_url}


def _chat(router: str, model: str, content: str) -> httpx.Response:
    body = {"model": model, "messages": [{"role": "user", "content": content}], "max_tokens": 8}
    headers = {"Authorization": f"Bearer {KEY}"}
    return httpx.post(router + "/v1/chat/completions", json=body, timeout=120, headers=headers)


def test_pinned_tiers_reach_their_vllm(tiers: dict[str, str]) -> None:
    for model, tier in (("edge", "edge"), ("center", "center")):
        r = _chat(tiers["router"], model, "Say hello.")
        assert r.status_code == 200, r.text
        assert r.headers["x-route-tier"] == tier
        assert 0 < r.json()["usage"]["completion_tokens"] <= 8


def test_openai_sdk_streams_from_both_tiers(tiers: dict[str, str]) -> None:
    with openai.OpenAI(base_url=tiers["router"] + "/v1", api_key=KEY, max_retries=0) as client:
        for model in ("edge", "center"):
            text, usage = sdk_stream(client, model)
            assert text
            assert 0 < usage.completion_tokens <= 8


def test_an_edge_whose_vllm_died_falls_back_to_the_center(tiers: dict[str, str]) -> None:
    assert _chat(tiers["router"], "auto", "hi").headers["x-route-tier"] == "edge"
    engine = httpx.get(tiers["edge"] + "/engine").json()
    os.killpg(engine["pid"], signal.SIGKILL)
    deadline = time.monotonic() + 10
    while httpx.get(tiers["edge"] + "/ready").status_code == 200:
        assert time.monotonic() < deadline
        time.sleep(0.1)
    for _ in range(3):
        r = _chat(tiers["router"], "auto", "hi")
        assert r.status_code == 200, r.text
        assert r.headers["x-route-tier"] == "center"
