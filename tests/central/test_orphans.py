"""A central gateway that dies (SIGKILL, as an OOM kill does) takes its engine
replicas with it, and the restarted gateway runs exactly the configured number
(issue 30). Real processes: `central serve` on the llama.cpp stand-in replicas,
and on two real `vllm serve` replicas (marked ``vllm``)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
import yaml

from hybrid_llm.local.proctree import Proc, descendants
from hybrid_llm.local.servers import REPO, all_replicas_healthy, free_port, wait_ready, wait_until
from servekit.procfs import same_process
from tests.support.vllm import HF_MODEL, VLLM, require_vllm

pytestmark = [pytest.mark.slow]


@contextmanager
def _gateway(config: Path, port: int, timeout: float) -> Iterator[subprocess.Popen[bytes]]:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    argv = [sys.executable, "-m", "central", "serve", "--config", str(config)]
    proc = subprocess.Popen([*argv, "--port", str(port)], cwd=REPO, env=env, start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_ready(url, timeout)
        wait_until(lambda: all_replicas_healthy(url), timeout, "all replicas healthy")
        yield proc
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(60)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


def _running(procs: list[Proc]) -> list[int]:
    return [pid for pid, started in procs if same_process(pid, started)]


def _replica_groups(gateway: int) -> list[int]:
    """The gateway's direct children: one lifeline watcher per replica, each leading its group."""
    return sorted(pid for pid, _ in descendants(gateway) if _parent(pid) == gateway)


def _parent(pid: int) -> int:
    from servekit.procfs import stat

    st = stat(pid)
    return st.ppid if st is not None else -1


def _kill_and_restart(config: Path, replicas: int, timeout: float) -> None:
    port = free_port()
    with _gateway(config, port, timeout) as first:
        engines = descendants(first.pid)
        assert len(_replica_groups(first.pid)) == replicas
        assert len(engines) >= replicas
        first.kill()
        first.wait()
        started = time.monotonic()
        while _running(engines) and time.monotonic() - started < 30:
            time.sleep(0.1)
        assert _running(engines) == [], "engines outlived their gateway"
        took = time.monotonic() - started
        assert took < 15, took
    with _gateway(config, port, timeout) as second:
        assert len(_replica_groups(second.pid)) == replicas
        assert _running(engines) == []


@pytest.mark.model
def test_a_killed_gateway_takes_its_llamacpp_replicas_along(
    model_path: Path, tmp_path: Path
) -> None:
    config: dict[str, Any] = yaml.safe_load((REPO / "configs" / "central-cpu.yaml").read_text())
    config["supervision"]["log_dir"] = str(tmp_path / "logs")
    config.pop("registry")
    for replica in config["replicas"]:
        replica["model_path"] = str(model_path)
    path = tmp_path / "central-cpu.yaml"
    path.write_text(yaml.safe_dump(config))
    _kill_and_restart(path, replicas=2, timeout=180)


@pytest.mark.vllm
def test_a_killed_gateway_takes_its_vllm_replicas_along(tmp_path: Path) -> None:
    require_vllm()
    config: dict[str, Any] = yaml.safe_load(
        (REPO / "configs" / "central-vllm-cpu.yaml").read_text()
    )
    config["supervision"]["log_dir"] = str(tmp_path / "logs")
    config.pop("registry")
    for replica in config["replicas"]:
        replica["executable"] = str(VLLM)
        replica["model"] = str(HF_MODEL)
        replica["cache_dir"] = str(tmp_path / "vllm-cache")
    path = tmp_path / "central-vllm-cpu.yaml"
    path.write_text(yaml.safe_dump(config))
    _kill_and_restart(path, replicas=2, timeout=450)
