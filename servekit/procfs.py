"""What Linux's ``/proc`` says about a process or a port.

A pid alone does not name a process: once it exits the kernel hands the
number out again. So a record of a process keeps its start time (clock ticks
since boot, field 22 of ``/proc/<pid>/stat``) beside the pid, and
:func:`same_process` checks both before anyone signals it.

:func:`port_holders` answers "who is listening on this TCP port": the socket
inodes in ``/proc/net/tcp`` and ``tcp6`` in state LISTEN, matched against
the ``socket:[inode]`` links under every ``/proc/<pid>/fd`` this user may
read.

:class:`ProcessRecord` is what a supervisor writes about each child it starts
(pid, start time, its own pid and start time, ports), so that a later
instance finds what a dead one left and stops it (:func:`stop_group`) instead
of starting a second copy beside it.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import time
from dataclasses import dataclass
from pathlib import Path

__all__ = [
    "ProcStat",
    "ProcessRecord",
    "describe",
    "group_left_by",
    "port_holders",
    "port_taken",
    "process_groups",
    "read_record",
    "same_process",
    "stat",
    "stop_group",
    "write_record",
]

_PROC = Path("/proc")
_LISTEN = "0A"


@dataclass(frozen=True, slots=True)
class ProcStat:
    pid: int
    ppid: int
    pgid: int
    state: str  # R, S, D, Z, ...
    start_ticks: int  # since boot: (pid, start_ticks) names one process for good
    name: str

    @property
    def zombie(self) -> bool:
        return self.state in ("Z", "X")


def stat(pid: int) -> ProcStat | None:
    """The process ``pid`` as ``/proc`` sees it now; None when there is none."""
    try:
        raw = (_PROC / str(pid) / "stat").read_text()
    except (OSError, ValueError):
        return None
    # The command name is in parentheses and may hold spaces: split after it.
    close = raw.rindex(")")
    name = raw[raw.index("(") + 1 : close]
    fields = raw[close + 2 :].split()
    return ProcStat(pid, int(fields[1]), int(fields[2]), fields[0], int(fields[19]), name)


def same_process(pid: int, start_ticks: int) -> bool:
    """``pid`` is still the (live, not zombie) process that started at ``start_ticks``."""
    now = stat(pid)
    return now is not None and now.start_ticks == start_ticks and not now.zombie


def process_groups(pgid: int) -> list[ProcStat]:
    """Every live process whose process group is ``pgid``."""
    found = []
    for entry in _PROC.iterdir():
        if entry.name.isdigit():
            st = stat(int(entry.name))
            if st is not None and st.pgid == pgid and not st.zombie:
                found.append(st)
    return found


def _socket_inodes(port: int, listening: bool) -> set[str]:
    inodes = set()
    for table in ("tcp", "tcp6"):
        try:
            lines = (_PROC / "net" / table).read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            cols = line.split()
            if len(cols) <= 9 or int(cols[1].rsplit(":", 1)[1], 16) != port:
                continue
            if cols[3] == _LISTEN or not listening:
                inodes.add(cols[9])
    return inodes - {"0"}  # TIME_WAIT sockets belong to no process


def port_holders(port: int, *, listening: bool = True) -> list[int]:
    """Pids of the processes holding a listening TCP socket on ``port`` (any
    address); with ``listening=False``, any TCP socket with that local port
    (an outgoing connection's ephemeral port blocks a bind too).

    Only processes this user may inspect are found; an empty list with the
    port still taken means someone else's process holds it.
    """
    inodes = _socket_inodes(port, listening)
    if not inodes:
        return []
    wanted = {f"socket:[{i}]" for i in inodes}
    pids = []
    for entry in _PROC.iterdir():
        if not entry.name.isdigit():
            continue
        with contextlib.suppress(OSError), os.scandir(entry / "fd") as fds:
            for fd in fds:
                with contextlib.suppress(OSError):
                    if os.readlink(fd.path) in wanted:
                        pids.append(int(entry.name))
                        break
    return sorted(pids)


@dataclass(frozen=True, slots=True)
class ProcessRecord:
    """A child a supervisor started, as written beside its log: enough for a
    later instance of that supervisor (or an operator) to find it again, and
    to tell it from an unrelated process that got the same pid since."""

    name: str
    pid: int  # also its process group: every child leads a session of its own
    start_ticks: int
    parent_pid: int
    parent_start_ticks: int
    ports: tuple[int, ...] = ()

    @classmethod
    def of(cls, name: str, pid: int, ports: tuple[int, ...] = ()) -> ProcessRecord | None:
        """The record of ``pid``, a child of this process; None if it is gone already."""
        child, me = stat(pid), stat(os.getpid())
        if child is None or me is None:
            return None
        return cls(name, pid, child.start_ticks, me.pid, me.start_ticks, ports)

    def parent_running(self) -> bool:
        return same_process(self.parent_pid, self.parent_start_ticks)

    def to_json(self) -> dict[str, object]:
        return {
            "name": self.name,
            "pid": self.pid,
            "start_ticks": self.start_ticks,
            "parent_pid": self.parent_pid,
            "parent_start_ticks": self.parent_start_ticks,
            "ports": list(self.ports),
        }

    @classmethod
    def from_json(cls, data: object) -> ProcessRecord | None:
        """A record read back; None when ``data`` is not one (a damaged file is no record)."""
        if not isinstance(data, dict):
            return None
        try:
            return cls(
                str(data["name"]),
                int(data["pid"]),
                int(data["start_ticks"]),
                int(data["parent_pid"]),
                int(data["parent_start_ticks"]),
                tuple(int(p) for p in data.get("ports", ())),
            )
        except (KeyError, TypeError, ValueError):
            return None


def read_record(path: Path) -> ProcessRecord | None:
    try:
        return ProcessRecord.from_json(json.loads(path.read_text(encoding="utf-8")))
    except (OSError, ValueError):
        return None


def write_record(path: Path, record: ProcessRecord) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(record.to_json()), encoding="utf-8")
    os.replace(tmp, path)


def group_left_by(pid: int, start_ticks: int) -> list[ProcStat]:
    """The live processes of the group that ``pid`` (started at ``start_ticks``) led.

    The leader may be gone while its group lives on; the kernel never hands
    out a group's id as a new pid while the group has members, so those are
    still the same group. A live leader with another start time means the pid
    was reused and the group is someone else's: nothing is returned.
    """
    leader = stat(pid)
    if leader is not None and leader.start_ticks != start_ticks:
        return []
    return process_groups(pid)


def stop_group(pid: int, start_ticks: int, grace_s: float) -> list[int]:
    """SIGTERM what is left of the group ``pid`` led (see :func:`group_left_by`),
    SIGKILL it after ``grace_s``; the pids that were running."""
    members = [p.pid for p in group_left_by(pid, start_ticks)]
    if not members:
        return []
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    while time.monotonic() < deadline and process_groups(pid):
        time.sleep(0.05)
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, signal.SIGKILL)
    return members


def describe(pid: int) -> str:
    """``pid 123 (python -m central serve ...)``, for messages to an operator."""
    try:
        cmd = (_PROC / str(pid) / "cmdline").read_bytes().replace(b"\0", b" ").decode().strip()
    except OSError:
        cmd = ""
    if len(cmd) > 100:
        cmd = cmd[:97] + "..."
    return f"pid {pid} ({cmd})" if cmd else f"pid {pid}"


def port_taken(port: int) -> str | None:
    """Who keeps ``port`` from being bound now (a message), None when it is free."""
    holders = port_holders(port)
    if holders:
        return ", ".join(describe(p) for p in holders)
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("0.0.0.0", port))
        except OSError:
            pass
        else:
            return None
    users = port_holders(port, listening=False)
    if users:
        return "a connection of " + ", ".join(describe(p) for p in users)
    return "a process of another user"
