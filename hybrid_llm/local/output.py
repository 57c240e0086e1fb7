"""Console output of ``hybrid-llm up`` that survives its reader going away.

``scripts/run.sh | tee run.log`` and Ctrl-C: the terminal's SIGINT reaches
``tee`` too, which exits first, and the supervisor's next line (``stopping
...``) meets a closed pipe. Python ignores SIGPIPE, so the write raises
``BrokenPipeError``; left alone that aborts the orderly stop half-way (and
even the interpreter's last flush of stdout fails). Here the first failed
write points stdout and stderr at ``/dev/null`` and everything else goes on:
the children are still stopped. (rich's own answer to a broken pipe is
``SystemExit(1)``, the same abort.)
"""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Callable
from typing import Any

from rich.console import Console, RenderableType

__all__ = ["Output"]


class _Console(Console):
    def __init__(self, on_broken: Callable[[], None], **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self._on_broken = on_broken

    def on_broken_pipe(self) -> None:
        self._on_broken()


class Output:
    """Status lines to stderr, tables to stdout, plain text (examples) to stdout."""

    def __init__(self) -> None:
        self.err = _Console(self._close, stderr=True)
        self.out = _Console(self._close, width=max(Console().width, 160))
        self.closed = False

    def say(self, message: RenderableType, **kwargs: Any) -> None:
        self._write(lambda: self.err.print(message, **kwargs))

    def show(self, renderable: RenderableType, **kwargs: Any) -> None:
        self._write(lambda: self.out.print(renderable, **kwargs))

    def plain(self, text: str) -> None:
        """Unwrapped (rich would wrap the one-liners a reader pastes)."""
        self._write(lambda: print(text, flush=True))

    def _write(self, write: Callable[[], object]) -> None:
        if self.closed:
            return
        try:
            write()
        except OSError:  # EPIPE, or the terminal went away
            self._close()

    def _close(self) -> None:
        if self.closed:
            return
        self.closed = True
        devnull = os.open(os.devnull, os.O_WRONLY)
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(OSError, ValueError):
                os.dup2(devnull, stream.fileno())
        os.close(devnull)
