"""Ctrl-C on every long-running command: a real SIGINT to the real CLI in a
subprocess stops it after an orderly shutdown, exit status 0, and nothing on
stderr that looks like a crash (no ``Traceback``, no ``KeyboardInterrupt``).

The four ``serve`` commands run through ``servekit.serve.run_service``; the
rollout controller, the delay proxies and ``hybrid-llm up`` (foreground)
handle the signal in their own event loops.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import IO

import httpx
import pytest

from tests.hybrid_llm.test_topology import _topology
from tests.support.servers import REPO, free_port


@dataclass
class Started:
    argv: list[str]  # after ``python -m``
    up: Callable[[str], bool]  # from its stdout so far: true once it is doing its work


def _answers(url: str) -> Callable[[str], bool]:
    def check(_: str) -> bool:
        try:
            return httpx.get(url, timeout=2).status_code == 200
        except httpx.HTTPError:
            return False

    return check


def _listens(port: int) -> Callable[[str], bool]:
    def check(_: str) -> bool:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
        except OSError:
            return False
        return True

    return check


def _router(tmp_path: Path, port: int) -> Started:
    return Started(["geo_router", "serve", "--port", str(port)], _answers(_health(port)))


def _edge(tmp_path: Path, port: int) -> Started:
    # A file that is no model: the agent serves /health (never /ready) without one.
    stand_in = tmp_path / "stand-in.gguf"
    stand_in.write_bytes(b"not a model")
    cfg = tmp_path / "edge.yaml"
    cfg.write_text(json.dumps({
        "server": {"host": "127.0.0.1", "port": port, "log_level": "warning"},
        "engine": {"model_path": str(stand_in), "model_name": "m"},
    }))  # fmt: skip
    return Started(["edge_agent", "serve", "--config", str(cfg)], _answers(_health(port)))


def _central(tmp_path: Path, port: int) -> Started:
    cfg = tmp_path / "central.yaml"
    cfg.write_text(json.dumps({
        "server": {"host": "127.0.0.1", "port": port},
        "model": "big",
        "replicas": [{"name": "r0", "kind": "url", "url": f"http://127.0.0.1:{free_port()}",
                      "load_source": "vllm", "capacity": 1}],
        "supervision": {"log_dir": str(tmp_path / "logs")},
    }))  # fmt: skip
    return Started(["central", "serve", "--config", str(cfg)], _answers(_health(port)))


def _artifacts(tmp_path: Path, port: int) -> Started:
    (tmp_path / "files").mkdir()
    argv = ["model_sync", "serve-artifacts", str(tmp_path / "files"), "--port", str(port)]
    return Started(argv, _answers(_health(port)))


def _controller(tmp_path: Path, port: int) -> Started:
    db = tmp_path / "registry.db"
    argv = ["model_sync", "--registry-db", str(db), "controller", "--tick", "0.2s"]
    return Started(argv, lambda out: "running" in out)  # its signal handlers are set


def _netem(tmp_path: Path, port: int) -> Started:
    route = f"{port}=127.0.0.1:{free_port()}@10"
    return Started(["hybrid_llm", "netem", "--route", route], _listens(port))


def _up(tmp_path: Path, port: int) -> Started:
    path, _ = _topology(tmp_path, netem=True)
    state = tmp_path / "var" / "hybrid-llm.json"

    def ready(_: str) -> bool:
        try:
            return bool(json.loads(state.read_text())["ready"])
        except (OSError, ValueError, KeyError):
            return False

    return Started(["hybrid_llm", "up", "--config", str(path), "--no-fetch"], ready)


class _Drain(threading.Thread):
    """Reads a child's pipe until it closes, so a chatty child never blocks on it."""

    def __init__(self, pipe: IO[bytes] | None) -> None:
        super().__init__(daemon=True)
        assert pipe is not None
        self.pipe = pipe
        self.lines: list[bytes] = []
        self.start()

    def run(self) -> None:
        with self.pipe:
            self.lines.extend(self.pipe)

    def text(self) -> str:
        return b"".join(self.lines).decode(errors="replace")


def _health(port: int) -> str:
    return f"http://127.0.0.1:{port}/health"


COMMANDS = {
    "geo-router serve": _router,
    "edge-agent serve": _edge,
    "central serve": _central,
    "model-sync serve-artifacts": _artifacts,
    "model-sync controller": _controller,
    "hybrid-llm netem": _netem,
    "hybrid-llm up": _up,
}


@pytest.mark.parametrize("name", list(COMMANDS))
def test_ctrl_c_stops_the_command_cleanly(tmp_path: Path, name: str) -> None:
    started = COMMANDS[name](tmp_path, free_port())
    # A shell's background jobs ignore SIGINT and children inherit that; a
    # terminal's foreground job does not: give the child the default back.
    proc = subprocess.Popen(
        [sys.executable, "-m", *started.argv],
        cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": str(REPO)},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    out, err = _Drain(proc.stdout), _Drain(proc.stderr)
    try:
        deadline = time.monotonic() + 60
        while not started.up(out.text()):
            assert proc.poll() is None, f"{name} exited with {proc.returncode}"
            assert time.monotonic() < deadline, f"{name} never came up"
            time.sleep(0.05)
        proc.send_signal(signal.SIGINT)
        proc.wait(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    out.join(10)
    err.join(10)
    stderr = err.text()
    assert proc.returncode == 0, stderr
    assert "Traceback" not in stderr
    assert "KeyboardInterrupt" not in stderr
