"""Supervised subprocesses: start in order, wait until each is ready, restart
crashed ones with backoff, stop all cleanly.

Each child runs in its own session (process group), so stopping it reaches
the whole group (a service's own workers included): SIGTERM, then SIGKILL
after ``stop_timeout``. Each is started under a lifeline
(:mod:`servekit.lifeline`), so if the supervisor itself dies (SIGKILL, OOM,
a broken pipe) every child's group is stopped within seconds too.
Descendants it started in sessions of their own and left running are killed
after it (:mod:`hybrid_llm.local.proctree`). Children are stopped in reverse
start order, so the front door goes first and the registry-backed services after it. Output goes
to one log file per child under the state directory.

A child that exits because one of its ports is held by another process is
reported as such ("cannot bind port P (held by pid X ...)") and not restarted:
it would only fail the same way again.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from hybrid_llm.local.proctree import descendants, kill_leftovers
from servekit.health_probe import probe_health
from servekit.lifeline import Lifeline
from servekit.procfs import port_taken, stat, stop_group

__all__ = ["ChildState", "ProcessSpec", "StartupError", "Supervisor"]


@dataclass(frozen=True)
class ProcessSpec:
    """One supervised process: its command line and how to tell it is ready."""

    name: str
    argv: Sequence[str]
    env: dict[str, str] = field(default_factory=dict)
    cwd: Path | None = None
    ready_url: str | None = None  # GET returning 200 means ready; None: ready once started
    ready_ports: tuple[int, ...] = ()  # or: these 127.0.0.1 ports accept connections
    ready_timeout: float = 180.0
    ports: tuple[int, ...] = ()  # it binds these: checked before start, named when taken
    labels: dict[str, str] = field(default_factory=dict)  # shown in the status table


class StartupError(Exception):
    """A child exited or never became ready during start; names it and shows its log."""


@dataclass
class ChildState:
    spec: ProcessSpec
    log_path: Path
    process: asyncio.subprocess.Process | None = None
    restarts: int = 0
    started_at: float = 0.0
    ready: bool = False
    failed: str | None = None  # why it is given up on (not restarted)
    lifeline: Lifeline | None = None
    start_ticks: int = 0  # with the pid, names its process group for good

    @property
    def pid(self) -> int | None:
        return self.process.pid if self.process is not None else None


def _log_tail(path: Path, lines: int = 15) -> str:
    try:
        text = path.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return "(no log)"
    return "\n".join(text.splitlines()[-lines:]) or "(empty log)"


async def _listening(ports: Sequence[int]) -> bool:
    for port in ports:
        try:
            _, writer = await asyncio.open_connection("127.0.0.1", port)
        except OSError:
            return False
        writer.close()
        with contextlib.suppress(OSError):
            await writer.wait_closed()
    return True


def port_holders(spec: ProcessSpec) -> list[tuple[int, str]]:
    """The ports ``spec`` needs that something holds now, with what holds each."""
    held = []
    for port in spec.ports:
        with contextlib.suppress(OSError):
            holder = port_taken(port)
            if holder is not None:
                held.append((port, holder))
    return held


class Supervisor:
    """Runs :class:`ProcessSpec` children; :meth:`start`, then :meth:`watch`, then :meth:`stop`."""

    def __init__(
        self,
        specs: Sequence[ProcessSpec],
        log_dir: Path,
        *,
        backoff_initial: float = 0.5,
        backoff_max: float = 30.0,
        stable_after: float = 30.0,
        stop_timeout: float = 15.0,
        on_event: Callable[[str], None] = lambda _msg: None,
        on_spawn: Callable[[ChildState], None] = lambda _child: None,
    ) -> None:
        names = [s.name for s in specs]
        if len(set(names)) != len(names):
            raise ValueError(f"process names must be unique: {names}")
        self.children = [ChildState(s, log_dir / f"{s.name}.log") for s in specs]
        self.log_dir = log_dir
        self.backoff_initial = backoff_initial
        self.backoff_max = backoff_max
        self.stable_after = stable_after
        self.stop_timeout = stop_timeout
        self.on_event = on_event
        self.on_spawn = on_spawn  # the child's pid is known: record it before it can be lost
        self.started = False  # every child came up once
        self._stopping = False
        self._stopped = asyncio.Event()

    async def start(self) -> None:
        """Start every child in order, each ready before the next; on failure stop all."""
        self.log_dir.mkdir(parents=True, exist_ok=True)
        try:
            async with httpx.AsyncClient(timeout=2.0) as client:
                for child in self.children:
                    await self._spawn(child)
                    await self._wait_ready(child, client)
                    self.on_event(f"{child.spec.name} ready (pid {child.pid})")
            self.started = True
        except BaseException:
            await self.stop()
            raise

    async def watch(self) -> None:
        """Restart children that exit, until :meth:`stop`; returns when stopped."""
        await asyncio.gather(*(self._watch(c) for c in self.children))

    async def stop(self) -> None:
        """SIGTERM every child (reverse order), SIGKILL whatever outlives the timeout."""
        self._stopping = True
        self._stopped.set()
        live = [c for c in reversed(self.children) if c.process and c.process.returncode is None]
        # Workers in sessions of their own are not in the child's group: note
        # them now, while they are still the child's, and kill what it leaves.
        # The group's own members die with the group (each child leads its own):
        # one SIGKILLed with it may not have exited yet when its leader is reaped,
        # and is no worker left behind.
        spawned = {
            id(c): descendants(c.process.pid, outside_group=c.process.pid)
            for c in live
            if c.process
        }
        for child in live:
            self._signal(child, signal.SIGTERM)
        deadline = time.monotonic() + self.stop_timeout
        for child in live:
            assert child.process is not None
            try:
                await asyncio.wait_for(child.process.wait(), max(0.1, deadline - time.monotonic()))
            except TimeoutError:
                self.on_event(f"{child.spec.name} ignored SIGTERM; killing")
                self._signal(child, signal.SIGKILL)
                await child.process.wait()
            # Workers of its process group that outlived the leader go too.
            self._signal(child, signal.SIGKILL)
            left = kill_leftovers(spawned[id(child)])
            if left:
                self.on_event(f"{child.spec.name} left {len(left)} process(es) behind; killed")
            self.on_event(f"{child.spec.name} stopped")
        for child in self.children:
            if child.lifeline is not None:
                child.lifeline.cut()
                child.lifeline = None

    # -- internals ------------------------------------------------------------
    async def _spawn(self, child: ChildState) -> None:
        env = dict(os.environ)
        env.update(child.spec.env)
        if child.lifeline is not None:
            child.lifeline.cut()  # the previous run's: it has exited
        if child.pid is not None:  # workers of the previous run's group that outlived it
            stop_group(child.pid, child.start_ticks, grace_s=0.0)
        lifeline = child.lifeline = Lifeline()
        with child.log_path.open("ab") as log:
            stamp = time.strftime("%H:%M:%S")
            log.write(f"--- {stamp} start: {' '.join(child.spec.argv)}\n".encode())
            log.flush()
            try:
                child.process = await asyncio.create_subprocess_exec(
                    *lifeline.wrap(child.spec.argv),
                    cwd=child.spec.cwd,
                    env=env,
                    stdin=asyncio.subprocess.DEVNULL,
                    stdout=log,
                    stderr=asyncio.subprocess.STDOUT,
                    start_new_session=True,
                    pass_fds=lifeline.pass_fds,
                )
            finally:
                lifeline.started()
        child.started_at = time.monotonic()
        child.ready = False
        info = stat(child.process.pid)
        child.start_ticks = info.start_ticks if info is not None else 0
        self.on_spawn(child)

    def _bind_failure(self, child: ChildState) -> str | None:
        """Why ``child`` (just exited) could not run, if a port of its was taken."""
        for port, holder in port_holders(child.spec):
            return f"{child.spec.name} cannot bind port {port} (held by {holder})"
        return None

    async def _wait_ready(self, child: ChildState, client: httpx.AsyncClient) -> None:
        assert child.process is not None
        url = child.spec.ready_url
        deadline = time.monotonic() + child.spec.ready_timeout
        last = "no answer yet"
        while True:
            if child.process.returncode is not None:
                blocked = self._bind_failure(child)
                if blocked is not None:
                    child.failed = blocked
                    raise StartupError(blocked)
                raise StartupError(
                    f"{child.spec.name} exited with {child.process.returncode} while starting; "
                    f"last lines of {child.log_path}:\n{_log_tail(child.log_path)}"
                )
            if url is None and not child.spec.ready_ports:
                break
            if url is not None:
                health = await probe_health(client, url)
                if health.up:
                    break
                last = health.reason
            elif await _listening(child.spec.ready_ports):
                break
            else:
                last = f"ports {child.spec.ready_ports} not all listening"
            if time.monotonic() > deadline:
                where = url or f"ports {child.spec.ready_ports}"
                raise StartupError(
                    f"{child.spec.name} not ready at {where} after "
                    f"{child.spec.ready_timeout:.0f}s ({last}); last lines of "
                    f"{child.log_path}:\n{_log_tail(child.log_path)}"
                )
            await asyncio.sleep(0.1)
        child.ready = True

    async def _watch(self, child: ChildState) -> None:
        backoff = self.backoff_initial
        async with httpx.AsyncClient(timeout=2.0) as client:
            while not self._stopping:
                assert child.process is not None
                code = await child.process.wait()
                if self._stopping:
                    return
                blocked = self._bind_failure(child)
                if blocked is not None:
                    child.failed = blocked
                    self.on_event(f"{blocked}; not restarting it")
                    return
                if time.monotonic() - child.started_at > self.stable_after:
                    backoff = self.backoff_initial
                self.on_event(
                    f"{child.spec.name} exited with {code}; restarting in {backoff:.1f}s "
                    f"(see {child.log_path})"
                )
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._stopped.wait(), backoff)
                if self._stopping:
                    return
                backoff = min(self.backoff_max, backoff * 2)
                child.restarts += 1
                await self._spawn(child)
                try:
                    await self._wait_ready(child, client)
                except StartupError:
                    if child.failed is not None:
                        self.on_event(f"{child.failed}; not restarting it")
                        return
                else:
                    self.on_event(f"{child.spec.name} back (pid {child.pid})")

    @staticmethod
    def _signal(child: ChildState, sig: signal.Signals) -> None:
        if child.process is None:
            return
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(child.process.pid, sig)
