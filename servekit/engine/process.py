"""Running an engine server as a supervised child process; one copy for both tiers.

A :class:`ProcessCommand` is what to run: argv, the environment it adds and
files to write first. The child's environment is an allowlisted part of
ours plus what the command adds (:mod:`servekit.engine.environ`), never all
of it. Building one has no side effects, so operators and tests
see precisely what would run. :class:`EngineProcess` runs it: the child gets a
session of its own (a stop reaches vLLM's engine-core and worker processes,
and trtllm-serve's per-GPU ranks, too) and a lifeline to this process
(:mod:`servekit.lifeline`: if the gateway or agent dies, however, the engine's
group is stopped within seconds), output is appended to a log file with
a header per start, and a stop is SIGTERM to the group, then SIGKILL after a
grace period. A record beside the log (``<name>.proc.json``: pid, start time,
parent, ports) lets the next start stop what a dead earlier instance left
before it starts another copy. :class:`ProcessSupervisor` keeps one running: a start deadline
and restarts after an exponential backoff that resets after a stable run.

The edge agent's vLLM engine and the central gateway's replicas both use
these; the health checks that decide "started" are the caller's.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import shlex
import shutil
import signal
import socket
import subprocess
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field

from servekit.engine.environ import engine_environ
from servekit.lifeline import DEFAULT_GRACE_S, Lifeline
from servekit.procfs import (
    ProcessRecord,
    group_left_by,
    read_record,
    stop_group,
    write_record,
)
from servekit.secrets import redact_argv, redact_env

__all__ = [
    "Backoff",
    "EngineProcess",
    "LaunchFailed",
    "ProcessCommand",
    "ProcessSettings",
    "ProcessSupervisor",
    "free_port",
    "log_tail",
]

log = logging.getLogger(__name__)


class LaunchFailed(Exception):
    """The engine's executable could not be started at all."""


@dataclass(frozen=True, slots=True)
class ProcessCommand:
    argv: tuple[str, ...]
    env: Mapping[str, str] = field(default_factory=dict)
    files: Mapping[Path, str] = field(default_factory=dict)

    def shell(self) -> str:
        """The command as one shell line (environment first), secret values shown
        as ``***``: it goes to logs and status pages."""
        env = " ".join(f"{k}={shlex.quote(v)}" for k, v in sorted(redact_env(self.env).items()))
        cmd = shlex.join(redact_argv(self.argv))
        return f"{env} {cmd}" if env else cmd


class ProcessSettings(BaseModel):
    """How an engine process is started, restarted and stopped."""

    model_config = ConfigDict(extra="forbid")

    startup_timeout_s: float = Field(
        1800.0, gt=0.0, description="How long the engine may take to become healthy."
    )
    restart_backoff_initial_s: float = Field(1.0, gt=0.0)
    restart_backoff_max_s: float = Field(60.0, gt=0.0)
    stable_after_s: float = Field(
        60.0, gt=0.0, description="Uptime after which the restart backoff resets."
    )
    stop_timeout_s: float = Field(30.0, gt=0.0, description="SIGTERM grace before SIGKILL.")
    pass_env: list[str] = Field(
        default_factory=list,
        description="Variables of the service's environment the engine gets beyond the "
        "allowlist (e.g. HF_TOKEN for a gated model); servekit.engine.environ.",
    )


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


class EngineProcess:
    """One launched engine process; restartable."""

    def __init__(
        self,
        name: str,
        command: ProcessCommand,
        log_path: Path,
        *,
        ports: tuple[int, ...] = (),
        orphan_grace_s: float = DEFAULT_GRACE_S,
        pass_env: Sequence[str] = (),
    ) -> None:
        self.name = name
        self.command = command
        self.pass_env = tuple(pass_env)  # names from our environment, beyond the allowlist
        self.log_path = log_path
        self.ports = ports
        self.orphan_grace_s = orphan_grace_s  # SIGTERM to SIGKILL once this process is gone
        self._proc: subprocess.Popen[bytes] | None = None
        self._lifeline: Lifeline | None = None
        self._started_at = 0.0

    @property
    def record_path(self) -> Path:
        return self.log_path.with_name(f"{self.name}.proc.json")

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
        """Write the command's files and spawn the process (does not wait for health).

        A copy left running by an earlier, dead instance of this supervisor
        (found through the record beside the log) is stopped first.
        """
        self._stop_leftover()
        for path, content in self.command.files.items():
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(content, encoding="utf-8")
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        env = engine_environ(self.command.env, self.pass_env)
        if self._lifeline is not None:
            self._lifeline.cut()  # the previous run's: it has exited
        with self.log_path.open("ab") as out:
            stamp = datetime.now(UTC).isoformat(timespec="seconds")
            out.write(f"--- {stamp} starting {self.name}: {self.command.shell()}\n".encode())
            out.flush()
            argv0 = self.command.argv[0]
            if shutil.which(argv0, path=env.get("PATH")) is None:
                out.write(f"--- cannot start: {argv0!r} is not an executable\n".encode())
                raise LaunchFailed(f"{self.name}: cannot run {argv0!r}: no such executable")
            lifeline = Lifeline(self.orphan_grace_s)
            try:
                self._proc = subprocess.Popen(
                    lifeline.wrap(self.command.argv),
                    stdin=subprocess.DEVNULL,
                    stdout=out,
                    stderr=subprocess.STDOUT,
                    env=env,
                    start_new_session=True,
                    pass_fds=lifeline.pass_fds,
                )
            except OSError as exc:
                lifeline.cut()
                out.write(f"--- cannot start: {exc}\n".encode())
                raise LaunchFailed(f"{self.name}: cannot run {argv0!r}: {exc}") from exc
            lifeline.started()
            self._lifeline = lifeline
        self._started_at = time.monotonic()
        record = ProcessRecord.of(self.name, self._proc.pid, self.ports)
        if record is not None:
            write_record(self.record_path, record)
        log.info("%s started (pid %s), log %s", self.name, self._proc.pid, self.log_path)

    def _stop_leftover(self) -> None:
        record = read_record(self.record_path)
        if record is None or not group_left_by(record.pid, record.start_ticks):
            return
        if self.alive:
            return  # this object's own run; its caller stops it
        if record.parent_running() and record.parent_pid != os.getpid():
            raise LaunchFailed(
                f"{self.name}: pid {record.pid} (ports {list(record.ports)}) runs it already "
                f"for pid {record.parent_pid}; {self.record_path} is in use"
            )
        whose = "its last run" if record.parent_pid == os.getpid() else "an earlier instance"
        log.warning(
            "%s: group %s, left running by %s (pid %s) on ports %s; stopping it",
            self.name, record.pid, whose, record.parent_pid, list(record.ports),
        )  # fmt: skip
        stop_group(record.pid, record.start_ticks, self.orphan_grace_s)

    async def stop(self, timeout_s: float) -> None:
        """SIGTERM the process group, SIGKILL it if still there after ``timeout_s``."""
        proc = self._proc
        if proc is None:
            return
        if proc.poll() is not None:
            # The leader is gone, but what it started in its session may not be.
            self._signal(proc, signal.SIGKILL)
            self._release()
            return
        self._signal(proc, signal.SIGTERM)
        try:
            await asyncio.to_thread(proc.wait, timeout_s)
        except subprocess.TimeoutExpired:
            log.warning("%s ignored SIGTERM for %.0fs; killing", self.name, timeout_s)
        # Whatever is left of the group (workers that outlived the leader) goes too.
        self._signal(proc, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            await asyncio.to_thread(proc.wait, 10.0)
        self._release()

    def _release(self) -> None:
        """Stopped on purpose: no lifeline or record is needed any more."""
        if self._lifeline is not None:
            self._lifeline.cut()
            self._lifeline = None
        record = read_record(self.record_path)
        if record is not None and self._proc is not None and record.pid == self._proc.pid:
            with contextlib.suppress(FileNotFoundError):
                self.record_path.unlink()

    @staticmethod
    def _signal(proc: subprocess.Popen[bytes], sig: signal.Signals) -> None:
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            pass
        except PermissionError:
            proc.send_signal(sig)


class ProcessSupervisor:
    """Keeps one :class:`EngineProcess` running: start deadline, restart with backoff."""

    def __init__(self, process: EngineProcess, settings: ProcessSettings) -> None:
        self.process = process
        self.settings = settings
        self.restarts = 0
        self.last_exit: int | None = None
        self._launched_at = 0.0
        self._backoff = Backoff(
            settings.restart_backoff_initial_s,
            settings.restart_backoff_max_s,
            settings.stable_after_s,
        )

    async def launch(self) -> None:
        """Start the process; a missing executable is logged and shows as an exit."""
        self._launched_at = time.monotonic()
        try:
            await asyncio.to_thread(self.process.start)
        except LaunchFailed as exc:
            log.error("%s", exc)

    @property
    def since_launch_s(self) -> float:
        return time.monotonic() - self._launched_at

    def startup_overdue(self) -> bool:
        return self.since_launch_s > self.settings.startup_timeout_s

    def next_delay(self) -> float:
        """Record an exit and return how long to wait before the next start."""
        self.last_exit = self.process.returncode
        return self._backoff.delay(self.process.uptime_s)

    async def relaunch(self, delay_s: float) -> None:
        await asyncio.sleep(delay_s)
        self.restarts += 1
        await self.launch()

    async def stop(self) -> None:
        await self.process.stop(self.settings.stop_timeout_s)


def log_tail(path: Path, lines: int = 12) -> str:
    """The last lines of a process log, for an error message."""
    try:
        text = path.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return ""
    return "\n".join(text.splitlines()[-lines:])


def free_port(host: str = "127.0.0.1") -> int:
    """A port that is free on ``host`` now (the engine binds it a moment later)."""
    with socket.socket() as s:
        s.bind((host if host not in ("", "0.0.0.0", "::") else "127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port
