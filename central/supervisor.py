"""Running one engine replica as a child process.

The process gets its own session (so a stop reaches the engine's worker
processes too: vLLM and trtllm-serve fork one per GPU rank), its output is
appended to ``<log_dir>/<name>.log`` with a header per start, and a stop is
SIGTERM to the group, then SIGKILL after a grace period.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import subprocess
import time
from datetime import UTC, datetime
from pathlib import Path

from central.commands import LaunchPlan

__all__ = ["Backoff", "LaunchFailed", "ReplicaProcess"]

log = logging.getLogger(__name__)


class LaunchFailed(Exception):
    """The replica's executable could not be started at all."""


class Backoff:
    """Exponential restart delay that resets once a run has been stable."""

    def __init__(self, initial_s: float, max_s: float, stable_after_s: float) -> None:
        self._initial = initial_s
        self._max = max_s
        self._stable_after = stable_after_s
        self._next = initial_s

    def delay(self, uptime_s: float) -> float:
        if uptime_s >= self._stable_after:
            self._next = self._initial
        delay = self._next
        self._next = min(self._max, self._next * 2)
        return delay


class ReplicaProcess:
    """One launched replica process; restartable."""

    def __init__(self, name: str, plan: LaunchPlan, log_path: Path) -> None:
        self.name = name
        self.plan = plan
        self.log_path = log_path
        self._proc: subprocess.Popen[bytes] | None = None
        self._started_at = 0.0

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc is not None else None

    @property
    def alive(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    @property
    def returncode(self) -> int | None:
        return self._proc.poll() if self._proc is not None else None

    @property
    def uptime_s(self) -> float:
        return time.monotonic() - self._started_at if self._proc is not None else 0.0

    def start(self) -> None:
        """Write the plan's files and spawn the process (does not wait for health)."""
        for path, content in self.plan.files.items():
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(content, encoding="utf-8")
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        env = dict(os.environ)
        env.update(self.plan.env)
        with self.log_path.open("ab") as out:
            stamp = datetime.now(UTC).isoformat(timespec="seconds")
            out.write(f"--- {stamp} starting {self.name}: {self.plan.shell()}\n".encode())
            out.flush()
            try:
                self._proc = subprocess.Popen(
                    self.plan.argv,
                    stdin=subprocess.DEVNULL,
                    stdout=out,
                    stderr=subprocess.STDOUT,
                    env=env,
                    start_new_session=True,
                )
            except OSError as exc:
                out.write(f"--- cannot start: {exc}\n".encode())
                raise LaunchFailed(f"{self.name}: cannot run {self.plan.argv[0]!r}: {exc}") from exc
        self._started_at = time.monotonic()
        log.info("replica %s started (pid %s), log %s", self.name, self._proc.pid, self.log_path)

    async def stop(self, timeout_s: float) -> None:
        """SIGTERM the process group, SIGKILL it if still there after ``timeout_s``."""
        proc = self._proc
        if proc is None or proc.poll() is not None:
            return
        self._signal(proc, signal.SIGTERM)
        try:
            await asyncio.to_thread(proc.wait, timeout_s)
        except subprocess.TimeoutExpired:
            log.warning("replica %s ignored SIGTERM for %.0fs; killing", self.name, timeout_s)
            self._signal(proc, signal.SIGKILL)
            await asyncio.to_thread(proc.wait, 10.0)

    def kill_now(self) -> None:
        """Last-resort synchronous kill (interpreter shutdown paths)."""
        if self._proc is not None and self._proc.poll() is None:
            self._signal(self._proc, signal.SIGKILL)
            with contextlib.suppress(subprocess.TimeoutExpired):
                self._proc.wait(5.0)

    @staticmethod
    def _signal(proc: subprocess.Popen[bytes], sig: signal.Signals) -> None:
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            pass
        except PermissionError:
            proc.send_signal(sig)
