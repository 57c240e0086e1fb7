"""Small shared pieces of the Consul double: Go durations, decoding, errors."""

from __future__ import annotations

import re
from typing import Any

__all__ = ["NODE", "HTTPError", "go_string", "norm", "parse_duration"]

_UNITS = {"ns": 1e-9, "us": 1e-6, "µs": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0, "h": 3600.0}
NODE = "consul-double"


def parse_duration(text: str) -> float:
    """A Go duration (``"1m30s"``, ``"250ms"``) in seconds."""
    parts = re.findall(r"([\d.]+)(ns|us|µs|ms|s|m|h)", text)
    if not parts or "".join(n + u for n, u in parts) != text.strip():
        if text.strip() == "0":
            return 0.0
        raise ValueError(f"time: invalid duration {text!r}")
    return sum(float(n) * _UNITS[u] for n, u in parts)


def go_string(seconds: float) -> str:
    """Go's ``time.Duration.String()``: ``5m0s``, ``30s``, ``500ms``."""
    if seconds == 0:
        return "0s"
    if seconds < 1:
        return f"{seconds * 1000:g}ms"
    whole = int(seconds)
    h, rest = divmod(whole, 3600)
    m, s = divmod(rest, 60)
    sec = f"{s + seconds - whole:g}s"
    return f"{h}h{m}m{sec}" if h else f"{m}m{sec}" if m else sec


def norm(body: dict[str, Any]) -> dict[str, Any]:
    """Case- and underscore-insensitive keys, as Consul's decoder accepts."""
    return {k.lower().replace("_", ""): v for k, v in body.items()}


class HTTPError(Exception):
    def __init__(self, status: int, text: str) -> None:
        self.status, self.text = status, text
