"""Hostile JSON is a 400 naming the limit, never a RecursionError or an infinity."""

from __future__ import annotations

import json

import pytest

from servekit.errors import InvalidRequest
from servekit.jsonlimits import MAX_DEPTH, depth_of, loads

HOSTILE = {
    "deep array": b"[" * 100_000 + b"]" * 100_000,
    "deep object": b'{"a":' * 100_000 + b"1" + b"}" * 100_000,
    "just over the depth": b"[" * (MAX_DEPTH + 1) + b"]" * (MAX_DEPTH + 1),
    "deep inside messages": b'{"messages": ' + b"[" * 40 + b"]" * 40 + b"}",
    "NaN": b'{"temperature": NaN}',
    "Infinity": b'{"temperature": -Infinity}',
    "float overflow": b'{"temperature": 1e999}',
    "long integer": b'{"max_tokens": ' + b"9" * 5000 + b"}",
    "long float": b'{"top_p": 0.' + b"1" * 100 + b"}",
    "not JSON": b'{"model": ',
    "not UTF-8": b'{"model": "\xff"}',
}


@pytest.mark.parametrize("raw", HOSTILE.values(), ids=HOSTILE.keys())
def test_hostile_bodies_are_invalid_json(raw: bytes) -> None:
    with pytest.raises(InvalidRequest) as info:
        loads(raw)
    assert info.value.status == 400
    assert info.value.code == "invalid_json"


def test_ordinary_bodies_decode_as_json_loads_does() -> None:
    body = {
        "model": "m",
        "messages": [{"role": "user", "content": "[[[{{{ brackets in text are fine " * 20}],
        "max_tokens": 12,
        "temperature": 0.5,
        "seed": -(2**62),
        "nested": [[[[{"a": [1]}]]]],
    }
    raw = json.dumps(body).encode()
    assert loads(raw) == json.loads(raw) == body
    assert loads(raw.decode()) == body
    assert loads(json.dumps(body).encode("utf-16")) == body  # json.loads reads UTF-16 too
    exact = b"[" * MAX_DEPTH + b"]" * MAX_DEPTH
    assert depth_of(loads(exact)) == MAX_DEPTH


def test_depth_counts_containers_not_scalars() -> None:
    assert depth_of(1) == 0
    assert depth_of([]) == 1
    assert depth_of({"a": [1, {"b": []}]}) == 4
