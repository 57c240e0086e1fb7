"""Children that die with their supervisor: a lifeline pipe each child watches.

Every supervisor here starts its children in sessions of their own (so that a
stop reaches a child's workers too), which also means nothing ties a child's
life to its parent's: a supervisor that is SIGKILLed or OOM-killed leaves its
children running. ``PR_SET_PDEATHSIG`` does not fit: it fires when the
*thread* that forked exits (supervisors spawn from worker threads), and it
reaches only the direct child, not the workers in its group.

So a parent opens a pipe per child and keeps the write end; the child is
started as ``python -m servekit.lifeline FD --grace S -- argv...``. That small
watcher leads the new session, runs ``argv`` as its own child in the same
process group, and blocks reading the pipe's read end. Only the parent holds
the write end (it is not inherited by anything else), so the read returns EOF
exactly when the parent is gone, however it went; the watcher then sends
SIGTERM to its whole group (the engine drains), and SIGKILL after the grace.
Since the watcher is the group's leader, signalling the child's pid as a
group (``killpg``) reaches it and the command alike, as before. The watcher
shrugs off SIGTERM/SIGINT/SIGHUP itself (the command receives the group
signal and exits; the watcher then exits with the command's status, a death
by signal included), so a clean stop still drains as it did.

A parent that closes the write end on purpose (:meth:`Lifeline.cut`) asks for
the same stop. The command itself dies (SIGKILL) if its watcher is killed;
workers it started in the group are left for the parent to stop with the
group, as it does when it restarts or stops the command.
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from types import FrameType

from servekit.procfs import process_groups

__all__ = ["DEFAULT_GRACE_S", "Lifeline", "main"]

DEFAULT_GRACE_S = 5.0
_PR_SET_PDEATHSIG = 1  # <linux/prctl.h>


class Lifeline:
    """One pipe between a parent and the child it is about to start.

    ``argv = lifeline.wrap(cmd)``, start ``argv`` with ``pass_fds=lifeline.pass_fds``
    (and a session of its own), then :meth:`started`; :meth:`cut` once the child
    has been reaped (or to make it stop).
    """

    def __init__(self, grace_s: float = DEFAULT_GRACE_S) -> None:
        self.grace_s = grace_s
        self._read, self._write = os.pipe()  # both close-on-exec: only pass_fds passes

    @property
    def pass_fds(self) -> tuple[int, ...]:
        return (self._read,) if self._read >= 0 else ()

    def wrap(self, argv: Sequence[str]) -> list[str]:
        """``argv`` run under the watcher, which holds the pipe's read end."""
        return [
            sys.executable,
            "-m",
            "servekit.lifeline",
            str(self._read),
            "--grace",
            f"{self.grace_s:g}",
            "--",
            *argv,
        ]

    def started(self) -> None:
        """The child holds its copy of the read end now; the parent's goes."""
        if self._read >= 0:
            os.close(self._read)
            self._read = -1

    def cut(self) -> None:
        """Close the write end: a watcher still running stops its group."""
        self.started()
        if self._write >= 0:
            os.close(self._write)
            self._write = -1


def _ignore(_signum: int, _frame: FrameType | None) -> None:
    """A handler, not SIG_IGN: an ignored signal would stay ignored in the exec'd command."""


def _die_with_watcher() -> None:
    """In the command, before exec: SIGKILL when the watcher dies (``kill -9`` of the
    pid a status table shows). The watcher's main thread spawns it and lives as
    long as the watcher, so the thread caveat of PR_SET_PDEATHSIG does not bite."""
    with contextlib.suppress(OSError, AttributeError):
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)


def _watch(fd: int, grace_s: float, exited: threading.Event, orphaned: threading.Event) -> None:
    with contextlib.suppress(OSError):
        while os.read(fd, 512):
            pass
    if exited.is_set():
        return
    # The parent is gone: the group drains, then whatever is left is killed
    # (the watcher with it).
    orphaned.set()
    with contextlib.suppress(OSError):
        os.killpg(0, signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    me = os.getpid()
    while time.monotonic() < deadline:
        if all(p.pid == me for p in process_groups(os.getpgrp())):
            return  # all drained: the watcher exits with the command's status
        time.sleep(0.05)
    with contextlib.suppress(OSError):
        os.killpg(0, signal.SIGKILL)


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    split = argv.index("--") if "--" in argv else len(argv)
    parser = argparse.ArgumentParser(
        prog="python -m servekit.lifeline", usage="%(prog)s FD [--grace S] -- COMMAND..."
    )
    parser.add_argument("fd", type=int, help="read end of the parent's lifeline pipe")
    parser.add_argument("--grace", type=float, default=DEFAULT_GRACE_S)
    args = parser.parse_args(argv[:split])
    command = argv[split + 1 :]
    if not command:
        parser.error("no command given")
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, _ignore)
    try:
        child = subprocess.Popen(command, preexec_fn=_die_with_watcher)
    except OSError as exc:
        print(f"lifeline: cannot run {command[0]!r}: {exc}", file=sys.stderr, flush=True)
        return 127
    exited, orphaned = threading.Event(), threading.Event()
    watcher = threading.Thread(
        target=_watch, args=(args.fd, args.grace, exited, orphaned), daemon=True
    )
    watcher.start()
    code = child.wait()
    exited.set()
    if orphaned.is_set():  # the rest of the group may still be draining
        watcher.join()
    if code < 0:  # died of a signal: so does the watcher, and the parent sees the same status
        signal.signal(-code, signal.SIG_DFL)
        os.kill(os.getpid(), -code)
        time.sleep(1.0)
    return code if code >= 0 else 128 - code


if __name__ == "__main__":
    sys.exit(main())
