"""Lifelines with real processes: an engine dies with the process that started
it, however that one ends; a clean stop and exit statuses are unchanged; a
copy a dead earlier instance left is found through its record and stopped."""

from __future__ import annotations

import asyncio
import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from servekit.engine.process import EngineProcess, ProcessCommand
from servekit.lifeline import Lifeline
from servekit.procfs import ProcessRecord, port_holders, process_groups, stat, write_record

REPO = Path(__file__).resolve().parents[2]

# An "engine" whose worker shares its group and shrugs off SIGTERM (as a stuck
# worker would): it prints the pids of both.
ENGINE = (
    "import subprocess, sys, time\n"
    "w = subprocess.Popen([sys.executable, '-c', "
    "'import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(120)'])\n"
    "import os; print('PIDS', os.getpid(), w.pid, flush=True)\n"
    "time.sleep(120)\n"
)


def _alive(pid: int) -> bool:
    st = stat(pid)
    return st is not None and not st.zombie


def _wait_for(path: Path, text: str, timeout: float = 30) -> str:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if path.exists() and text in (content := path.read_text()):
            return content
        time.sleep(0.05)
    raise AssertionError(f"{text!r} never appeared in {path}")


def _gone_within(pids: list[int], seconds: float) -> float:
    started = time.monotonic()
    while any(_alive(p) for p in pids):
        assert time.monotonic() - started < seconds, [p for p in pids if _alive(p)]
        time.sleep(0.05)
    return time.monotonic() - started


def _gateway(tmp_path: Path, grace: float) -> subprocess.Popen[bytes]:
    """A parent process that starts the engine through EngineProcess, then idles."""
    code = (
        "import sys, time\n"
        "from pathlib import Path\n"
        "from servekit.engine.process import EngineProcess, ProcessCommand\n"
        f"cmd = ProcessCommand((sys.executable, '-c', {ENGINE!r}))\n"
        f"p = EngineProcess('r0', cmd, Path({str(tmp_path / 'r0.log')!r}), "
        f"ports=(1234,), orphan_grace_s={grace})\n"
        "p.start()\n"
        "print('STARTED', p.pid, flush=True)\n"
        "time.sleep(120)\n"
    )
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    return subprocess.Popen(
        [sys.executable, "-c", code], env=env, stdout=subprocess.PIPE, start_new_session=True
    )


@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGTERM], ids=["sigkill", "sigterm"])
def test_engine_group_dies_with_its_parent(tmp_path: Path, sig: signal.Signals) -> None:
    gateway = _gateway(tmp_path, grace=1.0)
    try:
        assert gateway.stdout is not None
        line = gateway.stdout.readline().decode().split()
        assert line[0] == "STARTED", line
        watcher = int(line[1])
        log = _wait_for(tmp_path / "r0.log", "\nPIDS ")
        engine, worker = map(int, re.findall(r"^PIDS (\d+) (\d+)$", log, re.M)[0])
        assert {p.pid for p in process_groups(watcher)} == {watcher, engine, worker}
        record = json.loads((tmp_path / "r0.proc.json").read_text())
        assert record["pid"] == watcher
        assert record["parent_pid"] == gateway.pid
        assert record["ports"] == [1234]
        gateway.send_signal(sig)  # a gateway without a clean stop of its own
        gateway.wait(10)
        # SIGTERM to the group at once, SIGKILL for the stubborn worker after 1 s.
        took = _gone_within([watcher, engine, worker], 10)
        assert took < 5
    finally:
        if gateway.poll() is None:
            gateway.kill()
            gateway.wait()
        if gateway.stdout is not None:
            gateway.stdout.close()


def test_without_its_parent_the_watcher_waits_for_the_engine_to_drain(tmp_path: Path) -> None:
    code = (
        "import signal, sys, time\n"
        "def bye(*_):\n    time.sleep(0.5); print('drained', flush=True); sys.exit(0)\n"
        "signal.signal(signal.SIGTERM, bye)\n"
        "print('READY', flush=True)\n"
        "time.sleep(60)\n"
    )
    lifeline = Lifeline(grace_s=10)
    with (tmp_path / "e.log").open("wb") as out:
        proc = subprocess.Popen(
            lifeline.wrap([sys.executable, "-c", code]),
            stdout=out,
            start_new_session=True,
            pass_fds=lifeline.pass_fds,
        )
    lifeline.started()
    _wait_for(tmp_path / "e.log", "READY")
    lifeline.cut()  # what the parent's death does
    assert proc.wait(10) == 0
    assert "drained" in (tmp_path / "e.log").read_text()


def test_exit_status_and_clean_stop_are_the_commands(tmp_path: Path) -> None:
    lifeline = Lifeline()
    proc = subprocess.Popen(
        lifeline.wrap([sys.executable, "-c", "raise SystemExit(3)"]),
        start_new_session=True,
        pass_fds=lifeline.pass_fds,
    )
    lifeline.started()
    assert proc.wait(30) == 3
    lifeline.cut()
    lifeline = Lifeline()
    proc = subprocess.Popen(
        lifeline.wrap(
            [sys.executable, "-c", "import time; print('up', flush=True); time.sleep(60)"]
        ),
        stdout=subprocess.PIPE,
        start_new_session=True,
        pass_fds=lifeline.pass_fds,
    )
    lifeline.started()
    assert proc.stdout is not None
    with proc.stdout:
        assert proc.stdout.readline() == b"up\n"
    os.killpg(proc.pid, signal.SIGTERM)  # how every supervisor here stops a child
    assert proc.wait(30) == -signal.SIGTERM
    lifeline.cut()


def test_a_start_stops_the_copy_a_dead_earlier_instance_left(tmp_path: Path) -> None:
    # The leftover: a group whose recorded parent is gone (a process that has exited).
    leftover = subprocess.Popen(
        [sys.executable, "-c", "import time; time.sleep(120)"], start_new_session=True
    )
    dead_parent = subprocess.Popen([sys.executable, "-c", "pass"])
    dead_stat = stat(dead_parent.pid)
    assert dead_stat is not None
    dead_parent.wait()
    left_stat = stat(leftover.pid)
    assert left_stat is not None
    record = ProcessRecord("r0", leftover.pid, left_stat.start_ticks, dead_parent.pid,
                           dead_stat.start_ticks, (4321,))  # fmt: skip
    write_record(tmp_path / "r0.proc.json", record)
    proc = EngineProcess(
        "r0",
        ProcessCommand((sys.executable, "-c", "import time; time.sleep(60)")),
        tmp_path / "r0.log",
        orphan_grace_s=2,
    )
    try:
        proc.start()
        assert leftover.wait(5) == -signal.SIGTERM
        assert proc.alive
        assert ProcessRecord.from_json(json.loads((tmp_path / "r0.proc.json").read_text())) == (
            ProcessRecord.of("r0", proc.pid or 0)
        )
    finally:
        if leftover.poll() is None:
            leftover.kill()
            leftover.wait()
        asyncio.run(proc.stop(timeout_s=5))


def test_port_holders_names_the_listening_process() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
        assert port_holders(port) == []
        s.listen()
        assert port_holders(port) == [os.getpid()]
