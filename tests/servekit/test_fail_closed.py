"""Fail closed: a service that anyone could call does not start on a reachable address.

Without service tokens (edge, center) or with anonymous callers allowed
(router), a service listens only on loopback unless its settings say
``server.allow_unauthenticated: true``. The real CLI is run once for each
service kind; the shipped example configs must all pass the same check.
"""

from __future__ import annotations

import ssl
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from central.settings import CentralSettings
from edge_agent.settings import EdgeSettings
from geo_router.settings import RouterSettings
from hybrid_llm.local.servers import REPO, free_port
from servekit.config import ConfigError, load_settings
from servekit.serve_cli import refuse_open, reload_refusal
from servekit.service_auth import refuse_open_bind
from servekit.tls import ServerTLSSettings, client_ca_change, reload_server_context, server_context
from tests.support.pki import PrivateCA

CONFIGS = REPO / "configs"


@pytest.mark.parametrize("host", ["127.0.0.1", "::1", "[::1]", "localhost"])
def test_loopback_may_run_open(host: str) -> None:
    refuse_open_bind(host, "server.auth has no tokens", allowed=False)


@pytest.mark.parametrize("host", ["0.0.0.0", "::", "10.1.2.3", "edge-a.internal"])
def test_a_reachable_address_needs_auth_or_an_explicit_allow(host: str) -> None:
    with pytest.raises(ValueError, match=r"server\.allow_unauthenticated: true") as info:
        refuse_open_bind(host, "server.auth has no tokens", allowed=False)
    assert "server.auth has no tokens" in str(info.value)
    refuse_open_bind(host, "server.auth has no tokens", allowed=True)
    refuse_open_bind(host, None, allowed=False)  # tokens configured


def _run(module: str, config: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", module, "serve", "--config", str(config)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def test_the_router_refuses_to_serve_anonymous_callers_on_all_addresses(tmp_path: Path) -> None:
    cfg = tmp_path / "router.yaml"
    server = {"host": "0.0.0.0", "port": free_port()}
    cfg.write_text(yaml.safe_dump({"server": server, "auth": {"required": False}}))
    proc = _run("geo_router", cfg)
    assert proc.returncode == 2, proc.stderr
    assert "refusing to listen on 0.0.0.0" in proc.stderr
    assert "auth.required is false" in proc.stderr
    assert "server.allow_unauthenticated" in proc.stderr


def test_an_edge_without_tokens_refuses_to_listen_on_all_addresses(tmp_path: Path) -> None:
    cfg = tmp_path / "edge.yaml"
    (tmp_path / "config.json").write_text("{}")  # a model directory, never loaded
    data: dict[str, Any] = {
        "server": {"host": "0.0.0.0", "port": free_port()},
        "engine": {"kind": "vllm", "model": str(tmp_path), "model_name": "m"},
    }
    cfg.write_text(yaml.safe_dump(data))
    proc = _run("edge_agent", cfg)
    assert proc.returncode == 2, proc.stderr
    assert "server.auth has no tokens" in proc.stderr
    assert "server.allow_unauthenticated" in proc.stderr


def test_allow_unauthenticated_is_a_server_setting_of_every_service(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text("{}")
    engine = {"kind": "vllm", "model": str(tmp_path), "model_name": "m"}
    replica = {"name": "r", "kind": "url", "url": "http://10.0.0.9:8000"}
    shapes: list[tuple[type[Any], dict[str, Any]]] = [
        (RouterSettings, {"auth": {"required": False}}),
        (EdgeSettings, {"engine": engine}),
        (CentralSettings, {"model": "m", "replicas": [replica]}),
    ]
    for model, rest in shapes:
        opened = model.model_validate({**rest, "server": {"host": "0.0.0.0"}})
        with pytest.raises(ConfigError, match="allow_unauthenticated"):
            refuse_open(opened)
        allowed = {"host": "0.0.0.0", "allow_unauthenticated": True}
        refuse_open(model.model_validate({**rest, "server": allowed}))


@pytest.mark.parametrize(
    ("name", "model"),
    [
        ("router.yaml", RouterSettings),
        ("router-registry.yaml", RouterSettings),
        ("central-cpu.yaml", CentralSettings),
        ("central-vllm-cpu.yaml", CentralSettings),
        ("central-h100-vllm.yaml", CentralSettings),
        ("central-h100-trtllm.yaml", CentralSettings),
        ("edge-local.yaml", EdgeSettings),
        ("edge-single.yaml", EdgeSettings),
        ("edge-vllm-cpu.yaml", EdgeSettings),
        ("edge-vllm.yaml", EdgeSettings),
    ],
)
def test_the_shipped_configs_would_start(name: str, model: type[Any], tmp_path: Path) -> None:
    overrides: dict[str, Any] = {}
    if name == "edge-vllm.yaml":  # it names its production model directory
        (tmp_path / "config.json").write_text("{}")
        overrides["engine.model"] = str(tmp_path)
    settings = load_settings(model, CONFIGS / name, **overrides)
    refuse_open(settings)


# Reload (SIGHUP): what a live service cannot take on is refused, never half-applied.


def _edge(tmp_path: Path, **server: Any) -> EdgeSettings:
    (tmp_path / "config.json").write_text("{}")
    engine = {"kind": "vllm", "model": str(tmp_path), "model_name": "m"}
    return EdgeSettings.model_validate({"server": server, "engine": engine})


def test_a_reload_that_removes_the_tokens_is_refused(tmp_path: Path) -> None:
    closed = _edge(tmp_path, auth={"tokens": ["svc-1"]})
    opened = _edge(tmp_path)
    refusal = reload_refusal(closed, opened)
    assert refusal is not None
    assert "removes authentication" in refusal
    assert reload_refusal(closed, _edge(tmp_path, auth={"tokens": ["svc-2"]})) is None
    assert reload_refusal(opened, closed) is None  # closing is always fine


def test_a_reload_that_adds_or_drops_a_client_ca_is_refused(tmp_path: Path) -> None:
    ca = PrivateCA(tmp_path / "pki")
    issued = ca.issue("127.0.0.1")
    plain = ServerTLSSettings(cert_file=issued.cert_file, key_file=issued.key_file)
    mutual = plain.model_copy(update={"client_ca_file": ca.ca_file})
    assert "adds server.tls.client_ca_file" in (client_ca_change(plain, mutual) or "")
    assert "adds server.tls.client_ca_file" in (client_ca_change(None, mutual) or "")
    assert "drops server.tls.client_ca_file" in (client_ca_change(mutual, plain) or "")
    assert client_ca_change(mutual, mutual) is None
    # And the live context itself never trusts a CA without checking clients.
    live = server_context(plain)
    with pytest.raises(ValueError, match="requiring client certificates needs a restart"):
        reload_server_context(live, mutual)
    assert live.verify_mode == ssl.CERT_NONE
    reload_server_context(server_context(mutual), mutual)  # a renewed bundle is fine


# The edge's own `vllm serve`: a key of its own per server, never on show.


@pytest.mark.anyio
async def test_each_vllm_server_requires_a_random_key_its_engine_sends(tmp_path: Path) -> None:
    from servekit.engine.vllm import VllmEngine, VllmEngineSettings

    (tmp_path / "config.json").write_text("{}")
    settings = VllmEngineSettings(
        model=str(tmp_path), model_name="m", env={"VLLM_API_KEY": "from-config"}
    )
    first, second = VllmEngine(settings, version="v1"), VllmEngine(settings, version="v2")
    try:
        key = first.command.env["VLLM_API_KEY"]
        assert len(key) >= 32
        assert key not in ("from-config", second.command.env["VLLM_API_KEY"])
        assert not any(key in arg for arg in first.command.argv)  # not in `ps`
        assert key not in str(first.status())  # /engine and the start log line
        assert "VLLM_API_KEY='***'" in str(first.status()["command"])
        assert first._client.headers["Authorization"] == f"Bearer {key}"
        assert first._http.settings.api_key == key
    finally:
        await first.aclose()
        await second.aclose()
