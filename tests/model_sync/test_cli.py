"""The operator's view: ``model-sync`` subprocesses against an embedded registry
file shared with simulated edge nodes running real reconcilers in this process.
The controller runs as its own process and is killed mid-rollout."""

from __future__ import annotations

import json
import os
import signal
import sys
from collections import Counter
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import anyio
import pytest
from anyio.abc import Process

from hybrid_llm.local.servers import REPO
from model_sync.store import SyncStore
from servekit.registry import Registry, RegistrySettings, open_registry
from tests.model_sync.fleet import Fleet, actions, wait_state
from tests.model_sync.helpers import make_artifact

pytestmark = pytest.mark.anyio


def env() -> dict[str, str]:
    return os.environ | {"PYTHONPATH": f"{REPO}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}


async def cli(config: Path, *args: str, check: bool = True) -> tuple[int, str, str]:
    proc = await anyio.run_process(
        [sys.executable, "-m", "model_sync", "--config", str(config), "--actor", "carol", *args],
        env=env(),
        cwd=REPO,
        check=False,
    )
    out, err = proc.stdout.decode(), proc.stderr.decode()
    if check and proc.returncode != 0:
        raise AssertionError(f"model-sync {' '.join(args)} exited {proc.returncode}: {err}")
    return proc.returncode, out, err


async def cli_json(config: Path, *args: str) -> Any:
    return json.loads((await cli(config, "--json", *args))[1])


@asynccontextmanager
async def embedded(tmp_path: Path) -> AsyncIterator[tuple[Registry, Path]]:
    db = tmp_path / "registry.db"
    config = tmp_path / "model-sync.yaml"
    config.write_text(
        f"registry:\n  backend: embedded\n  embedded: {{path: {db}}}\n"
        "controller:\n  tick_s: 0.1\n  lock_ttl_s: 1.5\n"
        # other services' blocks in the same file are ignored
        "server: {port: 1}\n"
    )
    registry = await open_registry(
        RegistrySettings.model_validate({"backend": "embedded", "embedded": {"path": str(db)}})
    )
    try:
        yield registry, config
    finally:
        await registry.aclose()


@asynccontextmanager
async def controller_process(config: Path) -> AsyncIterator[Process]:
    proc = await anyio.open_process(
        [sys.executable, "-m", "model_sync", "--config", str(config), "controller"],
        env=env(),
        cwd=REPO,
    )
    try:
        yield proc
    finally:
        if proc.returncode is None:
            proc.kill()
        await proc.wait()


async def test_push_list_history_and_errors(tmp_path: Path) -> None:
    async with embedded(tmp_path) as (_, config):
        data, digest = make_artifact(tmp_path / "a" / "tiny.gguf", 4096)
        rec = await cli_json(
            config, "push", str(tmp_path / "a" / "tiny.gguf"), "--model", "tiny", "--version", "v1"
        )
        assert (rec["sha256"], rec["size"], rec["created_by"]) == (digest, len(data), "carol")
        listed = await cli_json(config, "list")
        assert [(r["name"], r["version"]) for r in listed] == [("tiny", "v1")]
        _, table, _ = await cli(config, "list")
        assert "tiny" in table
        assert digest[:12] in table
        make_artifact(tmp_path / "b" / "tiny.gguf", 4096)
        code, _, err = await cli(
            config,
            "push",
            str(tmp_path / "b" / "tiny.gguf"),
            "--model",
            "tiny",
            "--version",
            "v1",
            check=False,
        )
        assert code == 1
        assert "already registered" in err
        code, _, err = await cli(
            config, "push", "/nonexistent.gguf", "--model", "../x", "--version", "v1", check=False
        )
        assert code == 1
        assert "invalid model name '../x'" in err
        code, _, err = await cli(config, "rollout", "tiny", "v1", check=False)
        assert code == 1
        assert "no healthy edge nodes serve tiny" in err
        history = await cli_json(config, "history")
        assert [(e["action"], e["actor"]) for e in history] == [("push", "carol")]


@pytest.mark.slow
async def test_rollout_from_the_cli_survives_a_killed_controller(tmp_path: Path) -> None:
    async with embedded(tmp_path) as (registry, config):
        fleet = Fleet(registry, tmp_path, error_rate={}, ttft_ms={}, broken={"v3"})
        await fleet.publish("v1", "v2")
        store = SyncStore(registry)
        async with fleet.running():
            plan = await cli_json(
                config,
                "rollout",
                "tiny",
                "v2",
                "--canary",
                "1",
                "--waves",
                "by-region",
                "--bake",
                "1.5s",
                "--min-requests",
                "10",
            )
            assert [w["name"] for w in plan["waves"]] == ["canary", "region a", "region b"]
            async with controller_process(config) as first:
                await wait_state(
                    store, "tiny", lambda s: s.wave == 1 and s.step == "bake", within=60
                )
                first.send_signal(signal.SIGKILL)  # no clean-up, the lease just lapses
            async with controller_process(config):
                state = await wait_state(store, "tiny", lambda s: not s.active, within=90)
                status = await cli_json(config, "status", "tiny")
                _, table, _ = await cli(config, "status", "tiny")
                history = await store.history("tiny")
                # A version that cannot load: --wait follows it to the automatic rollback.
                await fleet.publish("v3")
                code, followed, _ = await cli(
                    config,
                    "rollout",
                    "tiny",
                    "v3",
                    "--canary",
                    "1",
                    "--bake",
                    "1s",
                    "--wait",
                    check=False,
                )
    assert state.status == "completed"
    assert {n["node"]: n["version"] for n in status["nodes"]} == dict.fromkeys(
        ["edge-a1", "edge-a2", "edge-b1", "edge-b2"], "v2"
    )
    assert status["traffic"] == {"v2": 1.0}
    assert "edge-b2" in table
    assert "completed" in table
    counts = Counter(a for a in actions(history) if a != "push")
    assert all(n == 1 for n in counts.values()), counts
    assert len(counts) == 11
    drivers = {e.actor for e in history if e.action.startswith(("wave", "gate"))}
    assert len(drivers) == 2, drivers  # two controller processes, no step done twice
    assert code == 3
    assert "auto-abort" in followed
    assert "llama_model_load: invalid magic" in followed
    assert "rollout of tiny ended: rolled_back" in followed
    assert fleet.versions() == dict.fromkeys(fleet.versions(), "v2")


def test_serve_artifacts_command(tmp_path: Path) -> None:
    import httpx

    from hybrid_llm.local.servers import free_port, service_process

    data, _ = make_artifact(tmp_path / "v2" / "tiny.gguf", 50_000)
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    args = ["model_sync", "serve-artifacts", str(tmp_path), "--port", str(port)]
    with service_process(args, url, ready_timeout=60):
        r = httpx.get(f"{url}/v2/tiny.gguf", headers={"Range": "bytes=10-19"})
        assert r.status_code == 206
        assert r.content == data[10:20]
        assert httpx.get(f"{url}/../etc/passwd").status_code == 404
