"""Decoding a client's JSON body with limits a hostile body cannot get past.

Python's ``json`` module recurses once per nesting level (a body 100,000
levels deep raises ``RecursionError``, which is no ``ValueError``), accepts
``NaN`` and ``Infinity`` (not JSON, and they turn into values no engine
takes), and hands numbers of any length to ``int()`` / ``float()``
(``1e999`` becomes infinity; a 4,000-digit integer costs quadratic time
before Python's own digit limit answers). :func:`loads` decodes with those
limits and raises :class:`~servekit.errors.InvalidRequest` (400,
``invalid_json``) for every one of them, so no body reaches a 500.

The cost on an ordinary body is one ``bytes.count`` per bracket kind: only a
body holding more than :data:`MAX_DEPTH` brackets (inside strings too) has
its decoded value walked to measure the real depth.
"""

from __future__ import annotations

import json
import math
from typing import Any

from servekit.errors import InvalidRequest

__all__ = ["MAX_DEPTH", "MAX_NUMBER_CHARS", "depth_of", "loads"]

MAX_DEPTH = 32
"""Deepest nesting of arrays and objects a body may have."""
MAX_NUMBER_CHARS = 40
"""Longest number literal (digits, sign, point, exponent) a body may hold."""


class _Refused(Exception):
    """A limit hit while decoding; becomes the 400 below."""


def _int(text: str) -> int:
    if len(text) > MAX_NUMBER_CHARS:
        raise _Refused(f"a number longer than {MAX_NUMBER_CHARS} characters")
    return int(text)


def _float(text: str) -> float:
    if len(text) > MAX_NUMBER_CHARS:
        raise _Refused(f"a number longer than {MAX_NUMBER_CHARS} characters")
    value = float(text)
    if not math.isfinite(value):
        raise _Refused(f"the number {text} is out of range")
    return value


def _constant(name: str) -> Any:
    raise _Refused(f"{name} is not a JSON number")


_DECODER = json.JSONDecoder(parse_int=_int, parse_float=_float, parse_constant=_constant)


def loads(raw: bytes | str) -> Any:
    """``raw`` decoded as JSON, or :class:`InvalidRequest` naming the limit it broke."""
    try:
        text = _text(raw) if isinstance(raw, bytes) else raw
        value = _DECODER.decode(text)
        if text.count("[") + text.count("{") <= MAX_DEPTH:
            return value  # cannot nest deeper than it has brackets
    except _Refused as exc:
        raise InvalidRequest(f"request body is not accepted: {exc}", code="invalid_json") from None
    except RecursionError:
        raise _too_deep() from None
    except ValueError as exc:  # UnicodeDecodeError is one too
        raise InvalidRequest(
            f"request body is not valid JSON: {exc}", code="invalid_json"
        ) from None
    if depth_of(value) > MAX_DEPTH:
        raise _too_deep()
    return value


def _text(raw: bytes) -> str:
    # json.loads's own reading of bytes: UTF-8, -16 or -32, lone surrogates kept
    return raw.decode(json.detect_encoding(raw), "surrogatepass")


def depth_of(value: Any) -> int:
    """How deep arrays and objects nest in ``value`` (a scalar is 0), without recursion."""
    deepest = 0
    stack: list[tuple[Any, int]] = [(value, 1)]
    while stack:
        item, level = stack.pop()
        if isinstance(item, dict):
            children: Any = item.values()
        elif isinstance(item, list):
            children = item
        else:
            continue
        deepest = max(deepest, level)
        if level > MAX_DEPTH:
            return level  # deep enough to refuse; no need to measure the rest
        stack.extend((child, level + 1) for child in children)
    return deepest


def _too_deep() -> InvalidRequest:
    return InvalidRequest(f"request body nests deeper than {MAX_DEPTH} levels", code="invalid_json")
