"""``hybrid-llm up`` with real processes: what a crash leaves, what a second
``up`` finds, and ``down`` after a dead supervisor (issue 30)."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from hybrid_llm.local.servers import REPO
from servekit.procfs import process_groups
from tests.hybrid_llm.test_topology import _alive, _run, _topology


def _up(tmp_path: Path, netem: bool = False) -> tuple[Path, dict[str, int], dict[str, object]]:
    path, ports = _topology(tmp_path, netem=netem)
    up = _run(["up", "--config", str(path), "--detach"], tmp_path, timeout=120)
    assert up.returncode == 0, up.stdout + up.stderr
    state = json.loads((tmp_path / "var" / "hybrid-llm.json").read_text())
    return path, ports, state


def _members(state: dict[str, object]) -> list[int]:
    """Every process of every service's group (the watcher and the service)."""
    children = state["children"]
    assert isinstance(children, list)
    return [p.pid for c in children for p in process_groups(int(c["pid"]))]


def _gone_within(pids: list[int], seconds: float, allowed: int = 0) -> list[int]:
    """Those of ``pids`` still alive once at most ``allowed`` are, or after ``seconds``."""
    deadline = time.monotonic() + seconds
    while sum(map(_alive, pids)) > allowed and time.monotonic() < deadline:
        time.sleep(0.1)
    return [p for p in pids if _alive(p)]


def test_a_killed_supervisor_takes_every_service_along(tmp_path: Path) -> None:
    path, _, state = _up(tmp_path)
    members = _members(state)
    assert len(members) == 6  # three services, each under its watcher
    started = time.monotonic()
    os.kill(int(str(state["pid"])), signal.SIGKILL)
    assert _gone_within(members, 15) == []
    took = time.monotonic() - started
    assert took < 10, took
    # Nothing is left for `down` to do, and a new `up` starts at once.
    down = _run(["down", "--config", str(path)], tmp_path)
    assert "stopped orphan" not in down.stderr
    again = _run(["up", "--config", str(path), "--detach"], tmp_path, timeout=120)
    try:
        assert again.returncode == 0, again.stdout + again.stderr
    finally:
        _run(["down", "--config", str(path)], tmp_path)


def test_a_second_up_refuses_naming_pids_and_ports(tmp_path: Path) -> None:
    path, ports, state = _up(tmp_path)
    try:
        started = time.monotonic()
        second = _run(["up", "--config", str(path), "--no-fetch"], tmp_path, timeout=60)
        assert time.monotonic() - started < 15
        assert second.returncode == 1
        err = " ".join(second.stderr.split())
        assert f"already running (supervisor pid {state['pid']}" in err
        for child in state["children"]:  # type: ignore[attr-defined]
            assert f"{child['name']} (pid {child['pid']}" in err
        for name in ("edge-a", "edge-b", "router"):
            assert f"port {ports[name]}" in err
        # The first one is untouched.
        assert all(_alive(p) for p in _members(state))
    finally:
        down = _run(["down", "--config", str(path)], tmp_path)
    assert down.returncode == 0


def test_down_stops_what_a_dead_supervisor_left(tmp_path: Path) -> None:
    """Supervisor and watchers killed at once (nothing left to pull a lifeline):
    the services die with their watchers, their workers in the group run on; a
    new `up` refuses, `down` clears them."""
    path, ports = _topology(tmp_path, netem=False)
    topo = yaml.safe_load(path.read_text())
    for service in topo["services"]:
        service["args"].append("--worker-group")
    path.write_text(yaml.safe_dump(topo))
    up = _run(["up", "--config", str(path), "--detach"], tmp_path, timeout=120)
    assert up.returncode == 0, up.stdout + up.stderr
    state = json.loads((tmp_path / "var" / "hybrid-llm.json").read_text())
    members = _members(state)
    assert len(members) == 9  # watcher, service, worker
    leaders = [int(c["pid"]) for c in state["children"]]
    for pid in (*leaders, int(state["pid"])):  # watchers first: they would act
        os.kill(pid, signal.SIGKILL)
    left = _gone_within(members, 3, allowed=3)  # the workers
    assert len(left) == 3
    second = _run(["up", "--config", str(path), "--no-fetch"], tmp_path, timeout=60)
    assert second.returncode == 1
    err = " ".join(second.stderr.split())
    assert "that is gone left these running" in err
    assert f"port {ports['router']}" in err
    down = _run(["down", "--config", str(path)], tmp_path)
    assert down.returncode == 0, down.stderr
    assert down.stderr.count("stopped orphan") == 3
    assert _gone_within(left, 15) == []


def test_up_names_the_process_holding_a_port(tmp_path: Path) -> None:
    path, ports = _topology(tmp_path, netem=False)
    with socket.socket() as squatter:
        squatter.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        squatter.bind(("127.0.0.1", ports["router"]))
        squatter.listen()
        started = time.monotonic()
        up = _run(["up", "--config", str(path), "--no-fetch"], tmp_path, timeout=60)
    assert time.monotonic() - started < 15
    assert up.returncode == 1
    err = " ".join(up.stderr.split())
    assert f"port {ports['router']} (router) is held by pid {os.getpid()}" in err
    assert not (tmp_path / "var" / "hybrid-llm.json").exists()


@pytest.fixture(autouse=True)
def _no_leftovers(tmp_path: Path) -> object:
    yield
    state = tmp_path / "var" / "hybrid-llm.json"
    if state.exists():
        _run(["down", "--config", str(tmp_path / "topo.yaml")], tmp_path)


def test_up_whose_reader_is_gone_still_stops_its_services(tmp_path: Path) -> None:
    """`hybrid-llm up 2>&1 | tee log`, Ctrl-C: tee dies first, then up's output
    meets a closed pipe; up still stops every service and exits cleanly."""
    path, _ = _topology(tmp_path, netem=True)
    read, write = os.pipe()
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    up = subprocess.Popen(
        [sys.executable, "-m", "hybrid_llm", "up", "--config", str(path), "--no-fetch"],
        cwd=tmp_path,
        env=env,
        stdout=write,
        stderr=write,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    os.close(write)
    state_path = tmp_path / "var" / "hybrid-llm.json"
    try:
        deadline = time.monotonic() + 60
        with os.fdopen(read, "rb"):  # tee
            while not _ready(state_path):
                assert up.poll() is None
                assert time.monotonic() < deadline
                time.sleep(0.1)
            members = _members(json.loads(state_path.read_text()))
            assert len(members) == 8  # netem and three services, each under its watcher
        up.send_signal(signal.SIGINT)  # the reader is gone: every write now fails (EPIPE)
        assert up.wait(60) == 0
        assert [
            p for p in members if _alive(p)
        ] == []  # stopped by up itself, not left to lifelines
    finally:
        if up.poll() is None:
            up.kill()
            up.wait()


def _ready(state: Path) -> bool:
    try:
        return bool(json.loads(state.read_text())["ready"])
    except (OSError, ValueError, KeyError):
        return False
