"""A process's descendants, whatever session they run in, from ``/proc``.

A service may start workers in sessions of their own (the central gateway
does, so that it can signal each replica's group apart), and signalling the
service's group does not reach them. If the service dies without stopping
them (killed after a stop timeout, or crashing), they are reparented to init
and nothing links them to the topology any more. So the supervisor notes a
child's descendants while the link still exists and stops the ones left over
once the child is gone. Each is identified by pid *and* start time, so a pid
reused meanwhile by an unrelated process is never signalled.
"""

from __future__ import annotations

import contextlib
import os
import signal
from pathlib import Path

from servekit.procfs import same_process, stat

__all__ = ["Proc", "descendants", "kill_leftovers"]

Proc = tuple[int, int]  # (pid, start time in clock ticks since boot)
_PROC = Path("/proc")


def descendants(pid: int, *, outside_group: int | None = None) -> list[Proc]:
    """Every live descendant of ``pid`` (children, their children, ...); with
    ``outside_group``, only those not in that process group (a stop that kills
    the group reaches the rest)."""
    children: dict[int, list[tuple[Proc, int]]] = {}
    for entry in _PROC.iterdir():
        if not entry.name.isdigit():
            continue
        st = stat(int(entry.name))
        if st is not None:
            children.setdefault(st.ppid, []).append(((st.pid, st.start_ticks), st.pgid))
    found: list[Proc] = []
    todo = [pid]
    while todo:
        for proc, pgid in children.get(todo.pop(), []):
            if pgid != outside_group:
                found.append(proc)
            todo.append(proc[0])
    return found


def kill_leftovers(procs: list[Proc], sig: signal.Signals = signal.SIGKILL) -> list[int]:
    """Signal those of ``procs`` still running as the same process; their pids."""
    hit = []
    for pid, started in procs:
        if not same_process(pid, started):
            continue
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, sig)
            hit.append(pid)
    return hit
