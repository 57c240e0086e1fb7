"""Durations as people and Go write them: ``90s``, ``5m``, ``1m30s``, ``250ms``.

:func:`parse_duration` reads what operators type on the command line and what
Consul prints (Go's ``time.Duration.String()``: ``5m0s``, ``1.5s``);
:func:`go_duration` writes the form Consul parses.
"""

from __future__ import annotations

import re

__all__ = ["go_duration", "parse_duration"]

_DURATION = re.compile(r"(\d+(?:\.\d+)?)(ms|s|m|h)?")
_UNITS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, None: 1.0}


def parse_duration(text: str) -> float:
    """``90``, ``90s``, ``5m``, ``1h``, ``1m30s``, ``250ms`` -> seconds."""
    total, pos = 0.0, 0
    text = text.strip()
    for match in _DURATION.finditer(text):
        if match.start() != pos:
            break
        total += float(match.group(1)) * _UNITS[match.group(2)]
        pos = match.end()
    if pos != len(text) or not text:
        raise ValueError(f"invalid duration {text!r} (examples: 90s, 5m, 1h, 250ms)")
    return total


def go_duration(seconds: float) -> str:
    """A duration string Go parses, at millisecond resolution (at least 1ms)."""
    return f"{max(1, round(seconds * 1000))}ms"
