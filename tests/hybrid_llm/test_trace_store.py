"""The local topology's trace store: Arize Phoenix as `hybrid-llm up --tracing` runs it.

The spec tests need nothing installed. The last test runs the real Phoenix
from its own environment (``scripts/setup.sh --phoenix``; skipped without
it) exactly as the topology's spec says, sends one request through a
router and an edge agent exporting to it, and reads the trace back through
Phoenix's REST API.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from geo_router.app import create_app as create_router
from hybrid_llm.local.phoenix_serve import narrow
from hybrid_llm.local.servers import REPO, UvicornThread, free_port, wait_ready
from hybrid_llm.local.supervisor import ProcessSpec
from hybrid_llm.local.topology import TopologyError, TopologySettings, build_specs
from hybrid_llm.local.trace_store import StoredSpan, wait_for_trace
from servekit.config import ConfigError, load_settings
from tests.edge_agent.conftest import scripted_app, settings_from
from tests.geo_router.conftest import KEY, router_settings, upstream

LOCAL = REPO / "configs" / "local.yaml"
PHOENIX_PYTHON = REPO / ".phoenix" / "bin" / "python"
SECRET_PROMPT = "zebra-quartz-7781 what is the capital of France"


def _local(tmp_path: Path, **phoenix: Any) -> TopologySettings:
    """configs/local.yaml with ``--tracing`` and the Phoenix service's fields replaced."""
    topo = load_settings(TopologySettings, LOCAL, state_dir=str(tmp_path), tracing="local")
    data = topo.model_dump()
    store = next(s for s in data["services"] if s["kind"] == "traces")
    store.update(phoenix)
    return TopologySettings.model_validate(data)


def test_tracing_alone_starts_phoenix_first_on_loopback_and_every_service_exports_to_it(
    tmp_path: Path,
) -> None:
    topo = _local(tmp_path, python=sys.executable)  # as if installed
    specs = build_specs(topo, REPO)
    phoenix = specs[0]  # before anything that exports to it
    assert phoenix.name == "phoenix"
    assert list(phoenix.argv) == [sys.executable, "-m", "hybrid_llm.local.phoenix_serve", "serve"]
    env = phoenix.env
    assert (env["PHOENIX_HOST"], env["PHOENIX_PORT"], env["PHOENIX_GRPC_PORT"]) == (
        "127.0.0.1",
        "6006",
        "4317",
    )
    assert env["PHOENIX_WORKING_DIR"] == f"{tmp_path}/phoenix"  # SQLite under the state dir
    assert env["PHOENIX_ENABLE_AUTH"] == "false"
    assert env["PHOENIX_TELEMETRY_ENABLED"] == "false"
    assert env["PHOENIX_ALLOW_EXTERNAL_RESOURCES"] == "false"
    assert env["PHOENIX_AGENTS_DISABLE_BASH"] == "true"
    assert phoenix.ready_url == "http://127.0.0.1:6006/healthz"
    assert phoenix.ports == (6006, 4317)  # both checked before start
    assert topo.trace_endpoint() == "http://127.0.0.1:6006/v1/traces"

    from central.settings import CentralSettings
    from edge_agent.settings import EdgeSettings
    from geo_router.settings import RouterSettings

    rendered = tmp_path / "topology"
    for name, model in (
        ("edge-a", EdgeSettings),
        ("edge-b", EdgeSettings),
        ("center", CentralSettings),
        ("router", RouterSettings),
    ):
        tracing = load_settings(model, rendered / f"{name}.yaml").tracing
        assert (tracing.enabled, tracing.endpoint) == (True, topo.trace_endpoint()), name


def test_without_tracing_there_is_no_phoenix(tmp_path: Path) -> None:
    topo = load_settings(TopologySettings, LOCAL, state_dir=str(tmp_path))
    assert topo.trace_store() is None
    assert "phoenix" not in [s.name for s in build_specs(topo, REPO)]
    url = "http://127.0.0.1:4318/v1/traces"  # someone else's collector: no Phoenix either
    topo = load_settings(TopologySettings, LOCAL, state_dir=str(tmp_path), tracing=url)
    assert "phoenix" not in [s.name for s in build_specs(topo, REPO)]
    assert topo.trace_endpoint() == url


def test_a_missing_phoenix_environment_names_the_setup_command(tmp_path: Path) -> None:
    topo = _local(tmp_path, python=str(tmp_path / "nowhere" / "python"))
    with pytest.raises(TopologyError, match=r"install it with `scripts/setup.sh --phoenix`"):
        build_specs(topo, REPO)


def test_tracing_local_needs_a_trace_store(tmp_path: Path) -> None:
    path = tmp_path / "topo.yaml"
    path.write_text(
        "models: []\nservices:\n  - {name: a, kind: other, module: x, port: 9}\ntracing: local\n"
    )
    with pytest.raises(ConfigError, match="one service of kind traces"):
        load_settings(TopologySettings, path)


@pytest.mark.parametrize(
    ("address", "host", "bound"),
    [
        ("[::]:4317", "127.0.0.1", "127.0.0.1:4317"),
        ("0.0.0.0:4317", "127.0.0.1", "127.0.0.1:4317"),
        ("[::]:4317", "::1", "[::1]:4317"),
        ("10.1.2.3:4317", "127.0.0.1", "10.1.2.3:4317"),  # an address it was given stays
    ],
)
def test_phoenix_grpc_wildcards_are_narrowed_to_its_host(
    address: str, host: str, bound: str
) -> None:
    assert narrow(address, host) == bound


def test_up_tracing_alone_runs_the_trace_store_and_prints_it(tmp_path: Path) -> None:
    """``hybrid-llm up --tracing`` (no URL) through the real CLI, a tiny server as the store."""
    store_port, router_port = free_port(), free_port()

    def tiny(name: str, kind: str, port: int, **extra: Any) -> dict[str, Any]:
        module = "tests.hybrid_llm.tiny_server"
        spec = {"name": name, "kind": kind, "port": port, "module": module}
        return {**spec, "args": ["--port", "{port}"], **extra}

    topo = {
        "state_dir": str(tmp_path / "var"),
        "registry": str(tmp_path / "var" / "registry.db"),
        "models": [],
        "services": [
            tiny("router", "router", router_port, settings={"greeting": "hi"}),
            tiny("store", "traces", store_port, enabled=False),
        ],
    }
    path = tmp_path / "topo.yaml"
    path.write_text(yaml.safe_dump(topo))
    env = {**os.environ, "PYTHONPATH": str(REPO)}

    def run(*args: str) -> subprocess.CompletedProcess[str]:
        argv = [sys.executable, "-m", "hybrid_llm", *args, "--config", str(path)]
        return subprocess.run(
            argv, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120, check=False
        )

    up = run("up", "--detach", "--tracing")
    try:
        assert up.returncode == 0, up.stdout + up.stderr
        state = json.loads((tmp_path / "var" / "hybrid-llm.json").read_text())
        assert [c["name"] for c in state["children"]] == ["store", "router"]  # store first
        rendered = yaml.safe_load((tmp_path / "var" / "topology" / "router.yaml").read_text())
        endpoint = f"http://127.0.0.1:{store_port}/v1/traces"
        assert rendered["tracing"] == {
            "enabled": True,
            "endpoint": endpoint,
            "service_name": "router",
        }
        log = (tmp_path / "var" / "log" / "up.log").read_text()
        assert f"Traces: open http://127.0.0.1:{store_port}" in log
    finally:
        down = run("down")
    assert down.returncode == 0, down.stderr
    with pytest.raises(httpx.ConnectError):
        httpx.get(f"http://127.0.0.1:{store_port}/ready", timeout=2)


# -- the real Phoenix ---------------------------------------------------------------


def _listening(port: int) -> list[str]:
    """Local addresses of the sockets listening on ``port`` (hex, as /proc/net has them)."""
    found = []
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with open(table, encoding="ascii") as fh:
            for line in fh.readlines()[1:]:
                local, state = line.split()[1], line.split()[3]
                address, hex_port = local.rsplit(":", 1)
                if state == "0A" and int(hex_port, 16) == port:  # 0A: LISTEN
                    found.append(address)
    return found


def _loopback(hex_address: str) -> bool:
    if len(hex_address) == 8:  # IPv4, little-endian: 127.x.x.x ends in 7F
        return hex_address.endswith("7F")
    ipv4_mapped = "0000000000000000FFFF0000"
    return hex_address == "00000000000000000000000001000000" or (
        hex_address.startswith(ipv4_mapped) and hex_address.endswith("7F")
    )


@pytest.fixture(scope="module")
def phoenix(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, ProcessSpec]]:
    if not PHOENIX_PYTHON.exists():
        pytest.skip("Arize Phoenix is not installed (scripts/setup.sh --phoenix makes .phoenix/)")
    tmp = tmp_path_factory.mktemp("phoenix")
    port, grpc = free_port(), free_port()
    env = {"PHOENIX_GRPC_PORT": str(grpc)}
    topo = _local(tmp, port=port, also_binds=[grpc])
    data = topo.model_dump()
    store = next(s for s in data["services"] if s["kind"] == "traces")
    store["env"] = {**store["env"], **env}
    spec = build_specs(TopologySettings.model_validate(data), REPO)[0]
    log = (tmp / "phoenix.log").open("wb")
    proc = subprocess.Popen(
        spec.argv,
        cwd=spec.cwd,
        env={**os.environ, **spec.env},
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    try:
        assert spec.ready_url is not None
        wait_ready(spec.ready_url.removesuffix("/healthz"), timeout=120, path="/healthz")
        yield f"http://127.0.0.1:{port}", spec
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        log.close()


@pytest.mark.slow
def test_phoenix_listens_on_loopback_only(phoenix: tuple[str, ProcessSpec]) -> None:
    _, spec = phoenix
    for port in spec.ports:  # the web app and OTLP/HTTP, and the gRPC receiver
        addresses = _listening(port)
        assert addresses, f"nothing listens on {port}"
        assert all(_loopback(a) for a in addresses), (port, addresses)


@pytest.mark.slow
def test_one_request_through_the_router_is_one_trace_in_phoenix(
    phoenix: tuple[str, ProcessSpec], tmp_path: Path
) -> None:
    base, _ = phoenix
    tracing = {"enabled": True, "endpoint": f"{base}/v1/traces", "export_delay_ms": 50}
    stand_in = tmp_path / "stand-in.gguf"
    stand_in.write_bytes(b"GGUF scripted")
    trace_id = os.urandom(16).hex()
    with ExitStack() as stack:
        edge = stack.enter_context(
            UvicornThread(
                scripted_app(settings_from(stand_in, instance__id="edge-east", tracing=tracing))
            )
        )
        ups = [upstream(edge.url, id="edge-east")]
        router = stack.enter_context(
            UvicornThread(create_router(router_settings(ups, tracing=tracing)))
        )
        for server in (edge, router):
            wait_ready(server.url, timeout=30)
        body = {"model": "edge", "max_tokens": 4, "stream": True}
        body["messages"] = [{"role": "user", "content": SECRET_PROMPT}]
        headers = {"Authorization": f"Bearer {KEY}", "traceparent": f"00-{trace_id}-{'1' * 16}-01"}
        r = httpx.post(router.url + "/v1/chat/completions", json=body, headers=headers, timeout=30)
        assert r.status_code == 200, r.text
    with httpx.Client(timeout=10) as client:
        names = ("router.request", "router.attempt", "serve.request", "serve.prefill")
        spans = wait_for_trace(client, base, trace_id, names)

    def one(name: str) -> StoredSpan:
        found = [s for s in spans if s.name == name]
        assert len(found) == 1, (name, [s.name for s in spans])
        return found[0]

    request, attempt, served = one("router.request"), one("router.attempt"), one("serve.request")
    assert {s.trace_id for s in spans} == {trace_id}  # router and edge, one trace
    assert request.parent_id == "1" * 16  # the client's trace, continued
    assert attempt.parent_id == request.span_id
    assert served.parent_id == attempt.span_id  # across the hop, through traceparent
    assert served.attributes["serve.tier"] == "edge"
    assert request.attributes["request.id"] == r.headers["x-request-id"]
    assert "first_token" in attempt.events
    assert one("serve.prefill").parent_id == served.span_id
    for span in spans:
        assert "zebra-quartz" not in repr(span.attributes), span.name
