"""Turning generated token pieces into client text, safely and identically
for every engine: UTF-8 sequences split across tokens are held until whole,
and text that might be the start of a stop sequence is held until it is known
not to be one. A stop sequence ends the stream and is never emitted."""

from __future__ import annotations

import codecs
from collections.abc import Sequence

__all__ = ["TextStream"]


class TextStream:
    def __init__(self, stops: Sequence[str] = ()) -> None:
        self._stops = [s for s in stops if s]
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self._held = ""
        self.stopped = False
        self.text = ""  # everything emitted so far

    def push(self, piece: bytes) -> str:
        """Feed one token's bytes; return the text that can be emitted now."""
        if self.stopped:
            return ""
        return self._release(self._held + self._decoder.decode(piece))

    def flush(self) -> str:
        """End of generation: release held text (a dangling byte becomes U+FFFD)."""
        if self.stopped:
            return ""
        pending = self._held + self._decoder.decode(b"", final=True)
        self._held = ""
        out = self._cut_at_stop(pending)
        if out is None:
            out = pending
        self.text += out
        return out

    def _cut_at_stop(self, pending: str) -> str | None:
        best = -1
        for stop in self._stops:
            idx = pending.find(stop)
            if idx >= 0 and (best < 0 or idx < best):
                best = idx
        if best < 0:
            return None
        self.stopped = True
        self._held = ""
        return pending[:best]

    def _release(self, pending: str) -> str:
        cut = self._cut_at_stop(pending)
        if cut is not None:
            self.text += cut
            return cut
        hold = 0
        for stop in self._stops:
            # Longest suffix of pending that is a proper prefix of this stop.
            for n in range(min(len(stop) - 1, len(pending)), 0, -1):
                if pending.endswith(stop[:n]):
                    hold = max(hold, n)
                    break
        out = pending[: len(pending) - hold] if hold else pending
        self._held = pending[len(pending) - hold :] if hold else ""
        self.text += out
        return out
