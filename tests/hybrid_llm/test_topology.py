"""The topology config and `hybrid-llm up`/`status`/`down` with real subprocesses."""

from __future__ import annotations

import importlib
import json
import operator
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
import yaml

from hybrid_llm.local.servers import REPO, free_port, wait_ready
from hybrid_llm.local.topology import TopologySettings, build_specs, service_headers, with_services
from servekit.config import ConfigError, load_settings
from servekit.serve_cli import refuse_open


def _proxied_port() -> int:
    """A free port whose delay proxy's port (+1, ``port_offset`` below) is free too:
    a proxy that cannot bind leaves its port to whatever else listens there."""
    while True:
        port = free_port()
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port + 1))
            except OSError:
                continue
        return port


def _ports() -> dict[str, int]:
    """Ports for the three services such that no service port is another's proxy port."""
    while True:
        ports = {"edge-a": _proxied_port(), "edge-b": _proxied_port(), "router": free_port()}
        taken = [ports["edge-a"], ports["edge-a"] + 1, ports["edge-b"], ports["edge-b"] + 1]
        if len({*taken, ports["router"]}) == 5:
            return ports


def _topology(tmp_path: Path, netem: bool) -> tuple[Path, dict[str, int]]:
    ports = _ports()
    base = tmp_path / "base.yaml"
    base.write_text("greeting: hello\nnested: {keep: 1, change: 1}\n")

    def tiny(name: str, kind: str, region: str) -> dict[str, object]:
        return {
            "name": name,
            "kind": kind,
            "region": region,
            "port": ports[name],
            "module": "tests.hybrid_llm.tiny_server",
            "args": ["--port", "{port}"],
            "config": str(base),
            "settings": {"nested": {"change": "{port}"}, "peer": "{advertise_of[edge-b]}"},
        }

    topo = {
        "state_dir": str(tmp_path / "var"),
        "registry": str(tmp_path / "var" / "registry.db"),
        "models": [],
        "router_region": "a",
        "rtt": {"same_region_ms": 2, "rtt_ms": {"a": {"b": 80}}},
        "netem": {"enabled": netem, "port_offset": 1},
        "services": [
            tiny("edge-a", "edge", "a"),
            tiny("edge-b", "edge", "b"),
            tiny("router", "router", "a"),
        ],
    }
    path = tmp_path / "topo.yaml"
    path.write_text(yaml.safe_dump(topo))
    return path, ports


def test_specs_render_settings_and_delay_proxies(tmp_path: Path) -> None:
    path, ports = _topology(tmp_path, netem=True)
    topo = load_settings(TopologySettings, path)
    specs = build_specs(topo, REPO)
    assert [s.name for s in specs] == ["netem", "edge-a", "edge-b", "router"]
    routes = [a for a in specs[0].argv if "=" in a]
    assert routes == [
        f"{ports['edge-a'] + 1}=127.0.0.1:{ports['edge-a']}@2",
        f"{ports['edge-b'] + 1}=127.0.0.1:{ports['edge-b']}@80",
    ]
    # The services start only once their proxies listen (the proxy imports slower).
    assert specs[0].ready_ports == (ports["edge-a"] + 1, ports["edge-b"] + 1)
    rendered = yaml.safe_load((tmp_path / "var" / "topology" / "edge-a.yaml").read_text())
    # The base file survives the merge; a whole-placeholder port stays an integer.
    assert rendered == {
        "greeting": "hello",
        "nested": {"keep": 1, "change": ports["edge-a"]},
        "peer": f"http://127.0.0.1:{ports['edge-b'] + 1}",
    }
    assert specs[1].ready_url == f"http://127.0.0.1:{ports['edge-a']}/ready"
    assert specs[2].labels["rtt_ms"] == "80"


def test_local_topology_config_is_valid_and_renders_edge_settings(tmp_path: Path) -> None:
    topo = load_settings(
        TopologySettings, REPO / "configs" / "local.yaml", state_dir=str(tmp_path), netem=None
    )
    names = [s.name for s in topo.enabled()]
    assert {"edge-a", "edge-b", "center", "router"} <= set(names)
    router = topo.router()
    assert router is not None
    assert topo.url(router) == "http://127.0.0.1:8080"
    missing = [s.config for s in topo.enabled() if s.config and not (REPO / s.config).exists()]
    assert missing == []
    build_specs(topo, REPO)
    rendered = tmp_path / "topology"
    from edge_agent.settings import EdgeSettings

    edge = load_settings(EdgeSettings, rendered / "edge-b.yaml")
    assert (edge.server.port, edge.instance.region) == (8102, "region-b")


@pytest.mark.parametrize(
    ("service", "module", "model", "port_field"),
    [
        ("router", "geo_router.settings", "RouterSettings", "server.port"),
        ("center", "central.settings", "CentralSettings", "server.port"),
    ],
)
def test_local_topology_renders_valid_service_settings(
    tmp_path: Path, service: str, module: str, model: str, port_field: str
) -> None:
    settings_model = getattr(importlib.import_module(module), model)
    topo = load_settings(TopologySettings, REPO / "configs" / "local.yaml", state_dir=str(tmp_path))
    build_specs(topo, REPO)
    settings = load_settings(settings_model, tmp_path / "topology" / f"{service}.yaml")
    spec = next(s for s in topo.enabled() if s.name == service)
    assert operator.attrgetter(port_field)(settings) == spec.port
    # Every service shares the topology's registry; the router reads rollout shares there.
    assert settings.registry is not None
    assert settings.registry.embedded.path == topo.registry
    refuse_open(settings)  # `up` starts it: loopback, or tokens


def test_a_second_router_on_the_same_fleet(tmp_path: Path) -> None:
    """`hybrid-llm up --with router-2`: another router, same edges and registry."""
    from geo_router.settings import RouterSettings

    topo = load_settings(TopologySettings, REPO / "configs" / "local.yaml", state_dir=str(tmp_path))
    assert "router-2" not in [s.name for s in topo.enabled()]  # off unless asked for
    both = with_services(topo, ["router-2"])
    build_specs(both, REPO)
    first, second = (
        load_settings(RouterSettings, tmp_path / "topology" / f"{name}.yaml")
        for name in ("router", "router-2")
    )
    assert (first.server.port, second.server.port) == (8080, 8081)
    assert second.upstreams == first.upstreams
    assert second.registry == first.registry
    assert second.routing == first.routing
    with pytest.raises(ValueError, match="no such service: router-9"):
        with_services(topo, ["router-9"])


def test_the_center_can_run_on_vllm(tmp_path: Path) -> None:
    """`hybrid-llm up --center vllm`: the center's settings come from its vllm variant."""
    from central.settings import CentralSettings
    from central.specs import VllmReplica

    topo = load_settings(
        TopologySettings, REPO / "configs" / "local.yaml", state_dir=str(tmp_path), center="vllm"
    )
    build_specs(topo, REPO)
    center = load_settings(CentralSettings, tmp_path / "topology" / "center.yaml")
    assert [r.kind for r in center.replicas] == ["vllm", "vllm"]
    assert all(isinstance(r, VllmReplica) and not r.gpus for r in center.replicas)
    # The topology's own overrides still apply over the variant.
    assert center.server.port == 8100
    assert center.supervision.log_dir == tmp_path / "log" / "center-replicas"
    assert center.registry is not None
    with pytest.raises(ConfigError, match="center 'trtllm': no such variant"):
        load_settings(TopologySettings, REPO / "configs" / "local.yaml", center="trtllm")


def test_each_build_wires_one_fresh_token_per_tier(tmp_path: Path) -> None:
    """Edges take one token, the center another: a stolen edge's token does not open
    the center. The router sends each tier its own."""
    from central.settings import CentralSettings
    from edge_agent.settings import EdgeSettings
    from geo_router.settings import RouterSettings
    from servekit.service_auth import hash_token

    topo = load_settings(TopologySettings, REPO / "configs" / "local.yaml", state_dir=str(tmp_path))
    token_file = tmp_path / "secrets" / "service-token"
    center_file = tmp_path / "secrets" / "center-token"
    build_specs(topo, REPO)
    first = token_file.read_text().strip()
    build_specs(topo, REPO)
    token, center_token = token_file.read_text().strip(), center_file.read_text().strip()
    assert len(token) > 30
    assert len(center_token) > 30
    assert token != first  # every `up` has its own
    assert token != center_token
    for path in (token_file, center_file):
        assert path.stat().st_mode & 0o077 == 0  # readable by the owner only
    rendered = tmp_path / "topology"
    for edge in ("edge-a", "edge-b"):
        accepted = load_settings(EdgeSettings, rendered / f"{edge}.yaml").server.auth.digests()
        assert accepted == [hash_token(token)]
    center = load_settings(CentralSettings, rendered / "center.yaml")
    assert center.server.auth.digests() == [hash_token(center_token)]
    assert center.replica_client.token is not None
    assert center.replica_client.token.get_secret_value() == center_token
    router = load_settings(RouterSettings, rendered / "router.yaml")
    sent = {tier: router.peers.for_tier(tier).token for tier in ("edge", "center")}
    assert {t: s.get_secret_value() if s else None for t, s in sent.items()} == {
        "edge": token,
        "center": center_token,
    }
    text = (rendered / "router.yaml").read_text()
    assert token not in text  # files name the token files
    assert center_token not in text
    assert service_headers(tmp_path) == {"Authorization": f"Bearer {token}"}
    assert service_headers(tmp_path, "center") == {"Authorization": f"Bearer {center_token}"}


def test_the_center_as_up_configures_it_refuses_the_edges_token(tmp_path: Path) -> None:
    """A real gateway with the rendered center settings (its stand-in replicas swapped
    for a double that wants the same token): the edges' token gets 401, its own serves."""
    from central.app import create_app
    from central.settings import CentralSettings
    from hybrid_llm.local.engine_double import create_double
    from hybrid_llm.local.servers import UvicornThread

    topo = load_settings(TopologySettings, REPO / "configs" / "local.yaml", state_dir=str(tmp_path))
    build_specs(topo, REPO)
    edge_token = (tmp_path / "secrets" / "service-token").read_text().strip()
    center_token = (tmp_path / "secrets" / "center-token").read_text().strip()
    rendered = yaml.safe_load((tmp_path / "topology" / "center.yaml").read_text())
    settings_model = str(rendered["model"])
    with UvicornThread(create_double(settings_model, tokens=[center_token])) as double:
        rendered["replicas"] = [{"name": "double", "kind": "url", "url": double.url}]
        rendered.pop("registry", None)
        settings = CentralSettings.model_validate(rendered)
        with UvicornThread(create_app(settings)) as gateway:
            wait_ready(gateway.url, timeout=60)
            chat = {"model": settings.model, "messages": [{"role": "user", "content": "hi"}]}

            def ask(token: str) -> httpx.Response:
                headers = {"Authorization": f"Bearer {token}"}
                return httpx.post(
                    gateway.url + "/v1/chat/completions", json=chat, headers=headers, timeout=30
                )

            refused = ask(edge_token)
            assert refused.status_code == 401, refused.text
            assert refused.json()["error"]["code"] == "invalid_api_key"
            served = ask(center_token)
            assert served.status_code == 200, served.text


def test_the_edges_trust_the_topology_signing_key_kept_across_builds(tmp_path: Path) -> None:
    """The local path is the verified one: edges load only versions signed with the
    key `up` made (docs/model_sync.md, "Signed versions")."""
    from edge_agent.settings import EdgeSettings
    from model_sync.signing import RecordVerifier, SigningKey, public_key_text

    topo = load_settings(TopologySettings, REPO / "configs" / "local.yaml", state_dir=str(tmp_path))
    build_specs(topo, REPO)
    private = tmp_path / "secrets" / "operator.key"
    first = private.read_text()
    build_specs(topo, REPO)
    assert private.read_text() == first  # versions signed before a restart stay valid
    assert private.stat().st_mode & 0o077 == 0
    key = SigningKey.from_pem(first)
    for edge in ("edge-a", "edge-b"):
        sync = load_settings(EdgeSettings, tmp_path / "topology" / f"{edge}.yaml").model_sync
        assert sync is not None
        assert sync.trusted_keys == [public_key_text(key.public)]
        RecordVerifier(sync.trusted_keys)  # parses


def _run(args: list[str], cwd: Path, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    return subprocess.run(
        [sys.executable, "-m", "hybrid_llm", *args],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    stat = Path(f"/proc/{pid}/stat")
    return stat.exists() and stat.read_text().split()[2] != "Z"


def test_up_detach_status_and_down(tmp_path: Path) -> None:
    path, ports = _topology(tmp_path, netem=True)
    up = _run(["up", "--config", str(path), "--detach"], tmp_path, timeout=120)
    pid_file = tmp_path / "var" / "hybrid-llm.json"
    try:
        assert up.returncode == 0, up.stdout + up.stderr
        assert "edge-b" in up.stdout
        assert "curl -N http://127.0.0.1:" in up.stdout
        state = json.loads(pid_file.read_text())
        assert state["ready"] is True
        pids = {c["name"]: c["pid"] for c in state["children"]}
        assert set(pids) == {"netem", "edge-a", "edge-b", "router"}
        # Through edge-b's delay proxy a request pays the 80 ms RTT (plus a handshake).
        t0 = time.perf_counter()
        r = httpx.get(f"http://127.0.0.1:{ports['edge-b'] + 1}/ready", timeout=5)
        assert r.status_code == 200
        assert time.perf_counter() - t0 >= 0.16
        status = _run(["status", "--config", str(path)], tmp_path)
        assert status.returncode == 0
        rows = [line for line in status.stdout.splitlines() if "│" in line]
        assert sum(line.rstrip(" │").endswith("true") for line in rows) == 3
        # A crashed child comes back.
        os.killpg(pids["edge-a"], signal.SIGKILL)
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            time.sleep(0.2)
            new = {c["name"]: c for c in json.loads(pid_file.read_text())["children"]}
            if new["edge-a"]["pid"] != pids["edge-a"] and new["edge-a"]["restarts"] == 1:
                break
        else:
            pytest.fail("edge-a was not restarted")
        # The state names a child as soon as it is spawned; ready comes a little later.
        wait_ready(f"http://127.0.0.1:{ports['edge-a']}", timeout=20)
        supervisor = state["pid"]
        children = [c["pid"] for c in json.loads(pid_file.read_text())["children"]]
    finally:
        down = _run(["down", "--config", str(path)], tmp_path)
    assert down.returncode == 0, down.stderr
    assert not pid_file.exists()
    assert not _alive(supervisor)
    assert not any(_alive(p) for p in children)
    again = _run(["down", "--config", str(path)], tmp_path)
    assert "nothing is running" in again.stderr


@pytest.mark.model
def test_up_runs_the_real_edge_agent_behind_its_delay_proxy(
    tmp_path: Path, model_path: Path
) -> None:
    port = free_port()
    topo = {
        "state_dir": str(tmp_path / "var"),
        "registry": str(tmp_path / "var" / "registry.db"),
        "models_dir": str(model_path.parent),
        "router_region": "a",
        "rtt": {"rtt_ms": {"a": {"b": 60}}},
        "netem": {"enabled": True, "port_offset": 1},
        "services": [
            {
                "name": "edge-b",
                "kind": "edge",
                "region": "b",
                "port": port,
                "module": "edge_agent",
                "args": ["serve", "--config", "{config}"],
                "config": str(REPO / "configs" / "edge-local.yaml"),
                "settings": {
                    "server": {"port": "{port}"},
                    "instance": {"id": "{name}", "region": "{region}"},
                    "engine": {"model_path": str(model_path), "n_threads": 1},
                },
            }
        ],
    }
    path = tmp_path / "topo.yaml"
    path.write_text(yaml.safe_dump(topo))
    up = _run(["up", "--config", str(path), "--detach", "--no-fetch"], REPO, timeout=200)
    try:
        assert up.returncode == 0, up.stdout + up.stderr
        body = {"model": "edge", "max_tokens": 4, "messages": [{"role": "user", "content": "Hi"}]}
        direct = httpx.post(f"http://127.0.0.1:{port}/v1/chat/completions", json=body, timeout=60)
        assert direct.status_code == 200
        t0 = time.perf_counter()
        with httpx.Client(timeout=60) as client:
            proxied = client.get(f"http://127.0.0.1:{port + 1}/v1/models")
        assert proxied.status_code == 200
        assert time.perf_counter() - t0 >= 0.12  # handshake + request round trips at 60 ms
    finally:
        down = _run(["down", "--config", str(path)], REPO)
    assert down.returncode == 0


def test_tracing_turns_on_in_every_router_edge_and_center(tmp_path: Path) -> None:
    endpoint = "http://127.0.0.1:4318/v1/traces"
    topo = load_settings(
        TopologySettings, REPO / "configs" / "local.yaml", state_dir=str(tmp_path), tracing=endpoint
    )
    build_specs(topo, REPO)
    rendered = tmp_path / "topology"
    from central.settings import CentralSettings
    from edge_agent.settings import EdgeSettings
    from geo_router.settings import RouterSettings

    blocks = {
        "edge-a": load_settings(EdgeSettings, rendered / "edge-a.yaml").tracing,
        "center": load_settings(CentralSettings, rendered / "center.yaml").tracing,
        "router": load_settings(RouterSettings, rendered / "router.yaml").tracing,
    }
    for name, tracing in blocks.items():
        assert (tracing.enabled, tracing.endpoint, tracing.service_name) == (True, endpoint, name)
    rollout = rendered / "rollout.yaml"  # the controller has no tracing: block
    assert not rollout.exists() or "tracing" not in rollout.read_text()
