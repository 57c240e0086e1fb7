from __future__ import annotations

import contextlib
import json
import subprocess
from collections.abc import Iterator
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import pytest

from geo_router.auth_settings import hash_key
from geo_router.settings import RouterSettings
from hybrid_llm.local.servers import UvicornThread, free_port, service_process
from tests.geo_router.fake_upstream import Behavior, build_app
from tests.support.pki import PrivateCA

KEY = "sk-test-router-key"
BATCH_KEY = "sk-test-batch-key"


def router_settings(upstreams: list[dict[str, Any]], **extra: Any) -> RouterSettings:
    """Settings with two keys, a two-region RTT table and the given static upstreams."""
    data: dict[str, Any] = {
        "auth": {
            "keys": [
                {
                    "sha256": hash_key(KEY),
                    "tenant": "acme",
                    "priority": "interactive",
                    "operator": True,
                },
                {"sha256": hash_key(BATCH_KEY), "tenant": "etl", "priority": "batch"},
            ]
        },
        "region": {
            "default": "east",
            "rtt_ms": {"east": {"west": 60.0, "center": 20.0}, "west": {"center": 40.0}},
        },
        "routing": {"ttft_deadline_s": 2.0, "slow_start_s": 0.0},
        "upstreams": upstreams,
        "poll_interval_s": 0.2,
    }
    for key, value in extra.items():
        data[key] = {**data.get(key, {}), **value} if isinstance(value, dict) else value
    return RouterSettings.model_validate(data)


def upstream(url: str, tier: str = "edge", region: str = "east", **kw: Any) -> dict[str, Any]:
    return {"url": url, "tier": tier, "region": region, "id": kw.pop("id", url), **kw}


@contextlib.contextmanager
def serve_fake(behavior: Behavior) -> Iterator[str]:
    with UvicornThread(build_app(behavior)) as server:
        yield server.url


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> dict[str, PrivateCA]:
    """Two certificate authorities: the fleet's and another (certificates made in the test)."""
    base = tmp_path_factory.mktemp("pki")
    return {
        "fleet": PrivateCA(base / "fleet", "fleet"),
        "other": PrivateCA(base / "other", "other"),
    }


@pytest.fixture
def auth() -> dict[str, str]:
    return {"Authorization": f"Bearer {KEY}"}


def refused_url() -> str:
    """A port nobody listens on: connections are refused."""
    return f"http://127.0.0.1:{free_port()}"


def edge_agent(stack: ExitStack, region: str) -> tuple[str, subprocess.Popen[bytes]]:
    """A real ``edge-agent serve`` on the real model (``configs/edge-local.yaml``) in
    ``region``, id ``edge-<region>``, until ``stack`` closes: its URL and process."""
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    args = ["edge_agent", "serve", "--config", "configs/edge-local.yaml", "--port", str(port)]
    args += ["--region", region, "--id", f"edge-{region}"]
    proc = stack.enter_context(service_process(args, url))
    return url, proc


def router_process(stack: ExitStack, settings: RouterSettings, workdir: Path) -> str:
    """The real ``geo-router serve`` CLI on ``settings`` (its file in ``workdir``) until
    ``stack`` closes: its URL."""
    port = free_port()
    data = settings.model_dump(mode="json")
    data["server"]["port"] = port
    cfg = workdir / "router.yaml"
    cfg.write_text(json.dumps(data))
    url = f"http://127.0.0.1:{port}"
    stack.enter_context(service_process(["geo_router", "serve", "--config", str(cfg)], url))
    return url
