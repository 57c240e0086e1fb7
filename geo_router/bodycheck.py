"""Validating a completion body on the request path, cheaply when it is ordinary.

The router forwards the client's own JSON, so it needs the body as a dict
that the wire types (``servekit.wire``) accept. Running the pydantic model
on every request costs little warm but a few hundred microseconds when the
request lands on cold caches (the common case for a front door between
bursts). :func:`plainly_valid` is a short check that accepts only bodies the
wire type certainly accepts (exact types, in-range values, the usual message
shapes); anything it is unsure about
goes through the full model, which accepts it or raises the 400 that names
the parameter. So the outcome is the wire type's either way; only the cost
differs. A top-level field outside the OpenAI surface is refused first
(``servekit.wire.unknown_fields``: 400 ``unknown_parameter``), so what the
router forwards holds no engine-native field a client chose.
``tests/geo_router/test_bodycheck.py`` checks the "certainly" part
against the model on generated bodies.
"""

from __future__ import annotations

from typing import Any

from geo_router.continuation import Kind
from servekit import jsonlimits
from servekit.wire import ChatCompletionRequest, CompletionRequest, parse_request, unknown_fields

__all__ = ["capped_max_tokens", "plainly_valid", "validated_body"]

# JSON Schema counts 2.0 as an integer; the strict wire types do not.
_INT_FIELDS = ("max_tokens", "max_completion_tokens", "n", "seed")
_ROLES = frozenset(("system", "developer", "user", "assistant", "tool"))
_BIG = 2**63


def validated_body(kind: Kind, raw: bytes) -> dict[str, Any]:
    """The client's body as a dict (its own fields kept, to forward) once it validates."""
    body = jsonlimits.loads(raw)  # hostile JSON (depth, numbers, NaN) is a 400 here
    if isinstance(body, dict):
        for key in _INT_FIELDS:
            value = body.get(key)
            if isinstance(value, float) and value.is_integer():
                body[key] = int(value)
        if plainly_valid(kind, body):
            body["stream"] = body.get("stream", False)
            return _known(kind, body)
    model = ChatCompletionRequest if kind == "chat" else CompletionRequest
    parsed = parse_request(model, body)
    out: dict[str, Any] = body  # the wire type accepted it, so it is an object
    out["stream"] = parsed.stream
    return _known(kind, out)


def capped_max_tokens(body: dict[str, Any], default: int, cap: int) -> int:
    """Write the output budget into ``body``: the client's, at most ``cap``, else ``default``.

    Engines default to the rest of the context window, so a request without
    ``max_tokens`` would generate more than the tokens-per-minute limiter
    charged it. Returns the budget written (what the limiter charges).
    """
    budget = min(default, cap)
    for key in ("max_completion_tokens", "max_tokens"):
        asked = body.get(key)
        if isinstance(asked, int):
            body[key] = min(asked, cap)
    asked = body.get("max_completion_tokens")
    if not isinstance(asked, int):
        asked = body.get("max_tokens")
    if isinstance(asked, int):
        return int(asked)
    body["max_tokens"] = budget
    return budget


def _known(kind: Kind, body: dict[str, Any]) -> dict[str, Any]:
    refused = unknown_fields(kind, body)  # engine-native fields are ours to set, not clients'
    if refused is not None:
        raise refused
    return body


def _number(value: Any, low: float, high: float) -> bool:
    return value is None or (type(value) is float and low <= value <= high)


def _count(value: Any, low: int) -> bool:
    return value is None or (type(value) is int and low <= value < _BIG)


def _text(value: Any) -> bool:
    return value is None or type(value) is str


def plainly_valid(kind: Kind, body: dict[str, Any]) -> bool:
    """``True`` only if the wire type certainly accepts ``body`` (``False``: ask it)."""
    get = body.get
    model = get("model")
    if type(model) is not str or not model:
        return False
    if not (
        _count(get("max_tokens"), 1)
        and _count(get("seed"), -_BIG)
        and _number(get("temperature"), 0.0, 2.0)
        and _number(get("top_p"), 0.0, 1.0)
        and _number(get("presence_penalty"), -2.0, 2.0)
        and _number(get("frequency_penalty"), -2.0, 2.0)
        and _text(get("user"))
        and type(get("stream", False)) is bool
        and get("n", 1) == 1
        and type(get("n", 1)) is int
    ):
        return False
    stop = get("stop")
    if not (_text(stop) or (type(stop) is list and len(stop) <= 4 and all(map(_is_str, stop)))):
        return False
    options = get("stream_options")
    if options is not None and (
        type(options) is not dict or type(options.get("include_usage", False)) is not bool
    ):
        return False
    if kind == "completion":
        prompt = get("prompt")
        one = type(prompt) is list and len(prompt) == 1 and type(prompt[0]) is str
        return (type(prompt) is str or one) and get("echo", False) is False
    messages = get("messages")
    if type(messages) is not list or not messages or not _count(get("max_completion_tokens"), 1):
        return False
    for message in messages:
        if type(message) is not dict:
            return False
        role = message.get("role")
        if type(role) is not str or role not in _ROLES:
            return False
        if not (_text(message.get("content")) and _text(message.get("name"))):
            return False
    return True


def _is_str(value: Any) -> bool:
    return type(value) is str
