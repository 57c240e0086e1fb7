"""What ``hybrid-llm up`` keeps on disk while it runs, and what a later one reads.

Two files in the state directory:

- ``hybrid-llm.lock``: held (``flock``) by the running supervisor for its
  whole life; the kernel drops it however the supervisor ends, so "held"
  means "an ``up`` is running" with no stale-pid guessing;
- ``hybrid-llm.json``: the supervisor's pid and start time and, for each
  child, its pid (the leader of its process group), start time and ports,
  rewritten as soon as a child is spawned, before it can be lost.

A second ``up`` that finds the lock held refuses and names the supervisor,
its services' pids and their ports. One that finds the lock free but groups
of the recorded children still alive (a supervisor that died without its
lifelines stopping them, or with their watchers killed too) refuses as well,
and ``hybrid-llm down`` stops them. Every process is identified by pid *and*
start time (:mod:`servekit.procfs`), so a pid reused since is never signalled.
"""

from __future__ import annotations

import fcntl
import json
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hybrid_llm.local.supervisor import ProcessSpec, Supervisor, port_holders
from servekit.procfs import group_left_by, same_process, stat, stop_group

__all__ = [
    "LOCK_FILE",
    "STATE_FILE",
    "Leftover",
    "RunLock",
    "leftovers",
    "port_conflicts",
    "read_state",
    "running_message",
    "stop_leftovers",
    "supervisor_running",
    "write_state",
]

STATE_FILE = "hybrid-llm.json"
LOCK_FILE = "hybrid-llm.lock"


class RunLock:
    """The one-``up``-at-a-time lock of a state directory."""

    def __init__(self, state_dir: Path) -> None:
        self.path = state_dir / LOCK_FILE
        self._fd = -1

    def acquire(self) -> bool:
        """Take the lock if nobody holds it; False when another ``up`` does."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)  # not inherited by children
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            return False
        self._fd = fd
        return True

    def release(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1


@dataclass(frozen=True)
class Leftover:
    name: str
    pids: list[int]
    ports: list[int]
    pgid: int
    start_ticks: int

    def __str__(self) -> str:
        ports = f", port {', '.join(map(str, self.ports))}" if self.ports else ""
        return f"{self.name} (pid {', '.join(map(str, self.pids))}{ports})"


def write_state(path: Path, sup: Supervisor | None, ready: bool, config: Path) -> None:
    children = []
    if sup is not None:
        for c in sup.children:
            children.append(
                {
                    "name": c.spec.name,
                    "pid": c.pid,
                    # As spawned: the group outlives a leader that is gone by now.
                    "start_ticks": c.start_ticks if c.pid is not None else None,
                    "ports": list(c.spec.ports),
                    **c.spec.labels,
                    "ready_url": c.spec.ready_url,
                    "restarts": c.restarts,
                    "failed": c.failed,
                }
            )
    me = stat(os.getpid())
    data = {
        "pid": os.getpid(),
        "start_ticks": me.start_ticks if me is not None else None,
        "config": str(config),
        "ready": ready,
        "children": children,
    }
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(data, indent=1), encoding="utf-8")
    os.replace(tmp, path)


def read_state(path: Path) -> dict[str, Any] | None:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def supervisor_running(data: dict[str, Any]) -> bool:
    pid, started = data.get("pid"), data.get("start_ticks")
    if not isinstance(pid, int) or not isinstance(started, int):
        return False
    return same_process(pid, started)


def leftovers(data: dict[str, Any]) -> list[Leftover]:
    """The recorded children whose process groups still have live members."""
    found = []
    for child in data.get("children", []):
        pid, started = child.get("pid"), child.get("start_ticks")
        if not isinstance(pid, int) or not isinstance(started, int):
            continue
        members = group_left_by(pid, started)
        if members:
            ports = [int(p) for p in child.get("ports", [])]
            found.append(
                Leftover(str(child.get("name")), [m.pid for m in members], ports, pid, started)
            )
    return found


def stop_leftovers(found: Sequence[Leftover], grace_s: float = 10.0) -> list[Leftover]:
    """SIGTERM each leftover group, SIGKILL after ``grace_s``; the ones that were running."""
    return [left for left in found if stop_group(left.pgid, left.start_ticks, grace_s)]


def running_message(data: dict[str, Any] | None) -> str:
    """``supervisor pid 12; router (pid 34, port 8080), ...`` from a state file."""
    if data is None:
        return "no state file"
    names = ", ".join(str(left) for left in leftovers(data))
    return f"supervisor pid {data.get('pid')}" + (f"; {names}" if names else "")


def port_conflicts(specs: Sequence[ProcessSpec]) -> list[str]:
    """One line per port a service needs that something else holds now."""
    return [
        f"port {port} ({spec.name}) is held by {holder}"
        for spec in specs
        for port, holder in port_holders(spec)
    ]
