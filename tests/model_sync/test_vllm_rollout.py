"""A model-directory rollout on a real vLLM edge, under load through the router.

The edge agent (a subprocess, `edge-agent serve`) serves v1 of the converted
SmolLM2 directory through its own `vllm serve` and follows the registry. The
operator pushes v2 (a copy of the directory) and rolls it out with the real CLI
and controller while clients stream through the router: the agent downloads and
verifies every file, starts a second vLLM beside the first, warms it, switches
new requests to it, lets the old one finish and stops it. No request fails.
Then v3, whose shard was corrupted after publishing, is rejected and v2 keeps
serving. At most two vLLM servers run at any moment. The edge trusts only the
operator key made with `model-sync keygen`, and every version is pushed signed.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import anyio
import httpx
import pytest

from geo_router.app import create_app as router_app
from hybrid_llm.local.servers import REPO, UvicornThread, free_port, service_process, wait_until
from model_sync.records import ActualState
from model_sync.store import SyncStore
from servekit.registry import RegistrySettings, open_registry
from tests.geo_router.conftest import KEY, router_settings, upstream
from tests.support.vllm import HF_MODEL, MODEL_NAME, require_vllm, vllm_engine, write_edge_config

pytestmark = [pytest.mark.vllm, pytest.mark.slow, pytest.mark.timeout(900)]

NODE = "edge-vllm-1"


def _publish(src: Path, dest: Path, *, copy: tuple[str, ...] = ()) -> Path:
    """A published copy of the model directory: hard links, real copies for ``copy``."""
    dest.mkdir(parents=True)
    for path in src.iterdir():
        if path.is_file() and not path.name.startswith("."):
            if path.name in copy:
                shutil.copyfile(path, dest / path.name)
            else:
                os.link(path, dest / path.name)
    return dest


def _cli(db: Path, *args: str, timeout: float = 600) -> subprocess.CompletedProcess[str]:
    cmd = [sys.executable, "-m", "model_sync", "--registry-db", str(db), "--actor", "test", *args]
    return subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=timeout)


def _actual(db: Path) -> ActualState | None:
    async def read() -> ActualState | None:
        settings = RegistrySettings.model_validate({"embedded": {"path": str(db)}})
        registry = await open_registry(settings)
        try:
            return await SyncStore(registry).actual(NODE)
        finally:
            await registry.aclose()

    return anyio.run(read)


@dataclass
class Load:
    """Clients streaming chat completions through the router until stopped."""

    url: str
    ok: int = 0
    failures: list[str] = field(default_factory=list)
    versions: set[str] = field(default_factory=set)
    stop: threading.Event = field(default_factory=threading.Event)

    def run(self, clients: int) -> list[threading.Thread]:
        threads = [threading.Thread(target=self._client, args=(i,)) for i in range(clients)]
        for t in threads:
            t.start()
        return threads

    def _client(self, i: int) -> None:
        headers = {"Authorization": f"Bearer {KEY}"}
        with httpx.Client(timeout=120) as client:
            n = 0
            while not self.stop.is_set():
                n += 1
                body: dict[str, Any] = {
                    "model": MODEL_NAME,
                    "messages": [{"role": "user", "content": f"Client {i}, question {n}: hi"}],
                    "max_tokens": 12,
                    "stream": True,
                }
                try:
                    with client.stream(
                        "POST", self.url + "/v1/chat/completions", json=body, headers=headers
                    ) as resp:
                        text = resp.read().decode()
                    if resp.status_code != 200 or "data: [DONE]" not in text:
                        self.failures.append(f"{resp.status_code}: {text[:200]}")
                    else:
                        self.ok += 1
                except httpx.HTTPError as exc:
                    self.failures.append(repr(exc))
                self.stop.wait(0.2)  # steady traffic, not a flood: the new server must start


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    require_vllm()
    tmp = tmp_path_factory.mktemp("vllm-rollout")
    db = tmp / "registry.db"
    port = free_port()
    # Not pinned: during a swap two servers run, and with vLLM's automatic binding both
    # workers would share core 0 (the new one then starts many times slower).
    # Beside, always: on a machine shared with other work, host memory may look too short
    # for a second server and the agent would drain, leaving the router no upstream.
    engine = vllm_engine(tmp, model=str(HF_MODEL), cpu_threads_bind="nobind", swap="beside")
    made = _cli(db, "keygen", "--out", str(tmp / "keys"))
    assert made.returncode == 0, made.stderr
    config = write_edge_config(
        tmp / "edge.yaml",
        port,
        engine,
        instance={"id": NODE, "region": "east", "version": "v1"},
        registry={
            "backend": "embedded",
            "embedded": {"path": str(db)},
            "heartbeat_interval_s": 0.5,
            "ttl_s": 5,
        },
        model_sync={
            "model_dir": str(tmp / "node-models"),
            "local_roots": [str(HF_MODEL.parent), str(tmp / "published")],
            "watch_timeout_s": 0.5,
            "report_interval_s": 0.5,
            "trusted_keys_file": str(tmp / "keys" / "operator.pub"),
        },
        aliases=["edge"],
    )
    edge_url = f"http://127.0.0.1:{port}"
    controller = subprocess.Popen(
        [sys.executable, "-m", "model_sync", "--registry-db", str(db), "controller",
         "--tick", "0.2"],
        cwd=REPO, start_new_session=True,
    )  # fmt: skip
    try:
        args = ["edge_agent", "serve", "--config", str(config)]
        with service_process(args, edge_url, ready_timeout=420):
            # One upstream and nowhere to fail over to: the router's TTFT deadline is
            # not what is under test (the new server's start slows the old one on 2 cores).
            settings = router_settings(
                [upstream(edge_url, id=NODE)], routing={"ttft_deadline_s": 60.0}
            )
            with UvicornThread(router_app(settings)) as router:
                yield {"db": db, "edge": edge_url, "router": router.url, "tmp": tmp}
    finally:
        controller.terminate()
        controller.wait(30)


def _push(fleet: dict[str, Any], source: Path, version: str) -> None:
    key = fleet["tmp"] / "keys" / "operator.key"
    args = ["--signing-key-file", str(key), "push", str(source), "--model", MODEL_NAME]
    pushed = _cli(fleet["db"], *args, "--version", version)
    assert pushed.returncode == 0, pushed.stderr
    assert "registered" in pushed.stdout
    assert "not signed" not in pushed.stderr


def test_directory_rollout_under_load_fails_no_request(fleet: dict[str, Any]) -> None:
    db, tmp = fleet["db"], fleet["tmp"]
    _push(fleet, HF_MODEL, "v1")
    v2 = _publish(HF_MODEL, tmp / "published" / "v2" / HF_MODEL.name)
    _push(fleet, v2, "v2")
    before = httpx.get(fleet["edge"] + "/engine").json()
    assert before["version"] == "v1"

    load = Load(fleet["router"])
    threads = load.run(clients=2)
    try:
        wait_until(lambda: load.ok >= 6, 120, "traffic flowing before the rollout")
        rolled = _cli(
            db, "rollout", MODEL_NAME, "v2", "--canary", "1", "--bake", "2s",
            "--min-requests", "0", "--max-ttft-ratio", "20", "--converge-timeout", "8m",
            "--wait",
        )  # fmt: skip
        assert rolled.returncode == 0, rolled.stdout + rolled.stderr
        served_during = load.ok
        wait_until(lambda: load.ok >= served_during + 6, 120, "traffic on v2")
    finally:
        load.stop.set()
        for t in threads:
            t.join(180)
    assert load.failures == []
    after = httpx.get(fleet["edge"] + "/engine").json()
    assert after["version"] == "v2"
    assert after["pid"] != before["pid"]
    installed = tmp / "node-models" / MODEL_NAME / "v2" / HF_MODEL.name
    assert f" serve {installed.resolve()} " in after["command"]
    # The old server finished its streams and is gone: one vLLM left.
    wait_until(lambda: not _alive(before["pid"]), 60, "the old vLLM to stop")
    assert httpx.get(fleet["edge"] + "/load").json()["version"] == "v2"


def test_a_corrupted_shard_is_rejected_and_the_old_version_keeps_serving(
    fleet: dict[str, Any],
) -> None:
    db, tmp = fleet["db"], fleet["tmp"]
    v3 = _publish(HF_MODEL, tmp / "published" / "v3" / HF_MODEL.name, copy=("model.safetensors",))
    _push(fleet, v3, "v3")
    with (v3 / "model.safetensors").open("r+b") as shard:  # damaged after publishing
        shard.seek(50_000_000)
        shard.write(b"\xff" * 16)
    serving = httpx.get(fleet["edge"] + "/engine").json()
    rolled = _cli(
        db, "rollout", MODEL_NAME, "v3", "--canary", "1", "--bake", "1s",
        "--min-requests", "0", "--converge-timeout", "5m", "--wait",
    )  # fmt: skip
    assert rolled.returncode == 3, rolled.stdout + rolled.stderr  # rolled back
    # The controller rolled back because the node rejected the shard, naming it.
    history = _cli(db, "--json", "history", MODEL_NAME)
    assert "node failed to take the version" in history.stdout
    assert "ChecksumMismatch" in history.stdout
    assert "model.safetensors" in history.stdout
    actual = _actual(db)
    assert actual is not None
    assert actual.version == serving["version"]
    assert actual.state == "serving"
    assert not (tmp / "node-models" / MODEL_NAME / "v3").exists()
    still = httpx.get(fleet["edge"] + "/engine").json()
    assert still["pid"] == serving["pid"]
    headers = {"Authorization": f"Bearer {KEY}"}
    body = {"model": MODEL_NAME, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}
    answer = httpx.post(fleet["router"] + "/v1/chat/completions", json=body, headers=headers,
                        timeout=60)  # fmt: skip
    assert answer.status_code == 200


def _alive(pid: int) -> bool:
    stat = Path(f"/proc/{pid}/stat")
    return stat.exists() and stat.read_text().rsplit(")", 1)[1].split()[0] != "Z"


def _failed_rollout(db: Path, version: str, *, converge: str) -> str:
    """Roll ``version`` out to the canary, expect it rolled back (exit 3); the history."""
    rolled = _cli(
        db, "rollout", MODEL_NAME, version, "--canary", "1", "--bake", "1s",
        "--min-requests", "0", "--converge-timeout", converge, "--wait",
    )  # fmt: skip
    assert rolled.returncode == 3, rolled.stdout + rolled.stderr
    return _cli(db, "--json", "history", MODEL_NAME).stdout


def test_a_version_vllm_cannot_load_leaves_the_old_one_serving(fleet: dict[str, Any]) -> None:
    """v4 verifies (its manifest is of the broken files) but vLLM fails to load it: the
    new server exits during its start and the serving one is untouched."""
    db, tmp = fleet["db"], fleet["tmp"]
    v4 = tmp / "published" / "v4" / HF_MODEL.name
    _publish(HF_MODEL, v4, copy=("config.json",))
    (v4 / "model.safetensors").unlink()
    (v4 / "model.safetensors").write_bytes(b"not a safetensors file")
    _push(fleet, v4, "v4")
    serving = httpx.get(fleet["edge"] + "/engine").json()
    history = _failed_rollout(db, "v4", converge="8m")
    assert "EngineFailure" in history
    assert "vllm exited with code" in history
    still = httpx.get(fleet["edge"] + "/engine").json()
    assert (still["pid"], still["version"]) == (serving["pid"], serving["version"])
    headers = {"Authorization": f"Bearer {KEY}"}
    body = {"model": MODEL_NAME, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}
    answer = httpx.post(fleet["router"] + "/v1/chat/completions", json=body, headers=headers,
                        timeout=60)  # fmt: skip
    assert answer.status_code == 200


def test_an_unsigned_version_is_refused_before_a_byte_is_fetched(fleet: dict[str, Any]) -> None:
    """Registry write access alone does not choose what the edge loads."""
    db, tmp = fleet["db"], fleet["tmp"]
    v5 = _publish(HF_MODEL, tmp / "published" / "v5" / HF_MODEL.name)
    pushed = _cli(db, "push", str(v5), "--model", MODEL_NAME, "--version", "v5")  # no key
    assert pushed.returncode == 0, pushed.stderr
    assert "not signed" in pushed.stderr
    serving = httpx.get(fleet["edge"] + "/engine").json()
    history = _failed_rollout(db, "v5", converge="2m")
    assert "UntrustedRecord" in history
    assert "is not signed" in history
    assert not (tmp / "node-models" / MODEL_NAME / "v5").exists()
    assert not list((tmp / "node-models").glob(".partial/*v5*"))
    still = httpx.get(fleet["edge"] + "/engine").json()
    assert (still["pid"], still["version"]) == (serving["pid"], serving["version"])
