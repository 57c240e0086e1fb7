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

__all__ = ["Proc", "descendants", "kill_leftovers"]

Proc = tuple[int, int]  # (pid, start time in clock ticks since boot)
_PROC = Path("/proc")


def _stat(pid: int) -> tuple[int, int, str] | None:
    """(parent pid, start time, state) of ``pid``, None when it is gone."""
    try:
        raw = (_PROC / str(pid) / "stat").read_text()
    except OSError:
        return None
    # The command name is in parentheses and may hold spaces: split after it.
    fields = raw[raw.rindex(")") + 2 :].split()
    return int(fields[1]), int(fields[19]), fields[0]


def descendants(pid: int) -> list[Proc]:
    """Every live descendant of ``pid`` (children, their children, ...)."""
    children: dict[int, list[Proc]] = {}
    for entry in _PROC.iterdir():
        if not entry.name.isdigit():
            continue
        stat = _stat(int(entry.name))
        if stat is not None:
            children.setdefault(stat[0], []).append((int(entry.name), stat[1]))
    found: list[Proc] = []
    todo = [pid]
    while todo:
        for proc in children.get(todo.pop(), []):
            found.append(proc)
            todo.append(proc[0])
    return found


def kill_leftovers(procs: list[Proc], sig: signal.Signals = signal.SIGKILL) -> list[int]:
    """Signal those of ``procs`` still running as the same process; their pids."""
    hit = []
    for pid, started in procs:
        stat = _stat(pid)
        if stat is None or stat[1] != started or stat[2] == "Z":
            continue
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, sig)
            hit.append(pid)
    return hit
