"""The cheap body check accepts only what the wire types accept, and ordinary bodies pass it."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from geo_router.bodycheck import plainly_valid, validated_body
from servekit.errors import InvalidRequest
from servekit.wire import ChatCompletionRequest, CompletionRequest, parse_request

ODD = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-3, max_value=5),
    st.floats(min_value=-3.0, max_value=3.0),
    st.sampled_from([0.0, 1.0, 2.0, -2.0, 2**63, 2**63 - 1, -(2**63), 1.5]),
    st.integers(min_value=-(2**70), max_value=2**70),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=3),
    st.lists(st.one_of(st.text(max_size=2), st.integers()), max_size=5),
    st.dictionaries(st.sampled_from(["include_usage", "x"]), st.one_of(st.booleans(), st.none())),
)
MESSAGE = st.fixed_dictionaries(
    {"role": st.one_of(st.sampled_from(["user", "system", "assistant", "robot"]), ODD)},
    optional={"content": st.one_of(st.text(max_size=5), ODD), "name": ODD},
)
FIELDS = {
    "model": st.one_of(st.sampled_from(["auto", "m", ""]), ODD),
    "max_tokens": ODD,
    "max_completion_tokens": ODD,
    "temperature": ODD,
    "top_p": ODD,
    "presence_penalty": ODD,
    "frequency_penalty": ODD,
    "n": ODD,
    "seed": ODD,
    "stop": ODD,
    "stream": ODD,
    "stream_options": ODD,
    "user": ODD,
    "echo": ODD,
    "prompt": st.one_of(st.text(max_size=5), st.lists(st.text(max_size=3), max_size=2), ODD),
    "messages": st.one_of(st.lists(MESSAGE, max_size=3), ODD),
    "extra": ODD,
}
BASE = {
    "chat": {"model": "m", "messages": [{"role": "user", "content": "hi"}]},
    "completion": {"model": "m", "prompt": "hi"},
}
# A valid body with up to three fields set to odd or boundary values (or dropped).
OVERRIDES = st.fixed_dictionaries({}, optional=FIELDS)  # type: ignore[arg-type]


@settings(max_examples=1500, deadline=None)
@given(
    kind=st.sampled_from(["chat", "completion"]),
    overrides=OVERRIDES.filter(lambda d: len(d) <= 3),
    drop=st.sets(st.sampled_from(["model", "messages", "prompt"]), max_size=1),
)
def test_plainly_valid_bodies_are_valid(
    kind: str, overrides: dict[str, Any], drop: set[str]
) -> None:
    body = {**BASE[kind], **overrides}
    for key in drop:
        body.pop(key, None)
    model = ChatCompletionRequest if kind == "chat" else CompletionRequest
    if plainly_valid(kind, body):  # type: ignore[arg-type]
        parse_request(model, body)  # must not raise


@pytest.mark.parametrize(
    ("kind", "body"),
    [
        ("chat", {"model": "auto", "messages": [{"role": "user", "content": "hi"}]}),
        (
            "chat",
            {
                "model": "m",
                "stream": True,
                "stream_options": {"include_usage": True},
                "max_tokens": 64,
                "temperature": 0.7,
                "top_p": 1.0,
                "stop": ["\n"],
                "user": "u1",
                "messages": [
                    {"role": "system", "content": "be brief"},
                    {"role": "user", "content": "hi", "name": "bob"},
                ],
            },
        ),
        ("completion", {"model": "m", "prompt": "Once", "max_tokens": 8, "stream": False}),
        ("completion", {"model": "m", "prompt": ["Once"], "seed": -3}),
    ],
)
def test_ordinary_bodies_take_the_cheap_path(kind: str, body: dict[str, Any]) -> None:
    assert plainly_valid(kind, body)  # type: ignore[arg-type]
    out = validated_body(kind, json.dumps(body).encode())  # type: ignore[arg-type]
    assert out["stream"] is body.get("stream", False)


def test_unusual_bodies_still_get_the_wire_types_verdict() -> None:
    ok = validated_body(
        "chat",
        b'{"model":"m","messages":[{"role":"user","content":'
        b'[{"type":"text","text":"hi"}]}],"temperature":1,"max_tokens":2.0}',
    )
    assert ok["max_tokens"] == 2
    assert ok["stream"] is False
    with pytest.raises(InvalidRequest) as bad:
        validated_body("chat", b'{"model":"m","messages":[{"role":"user"}],"top_p":3}')
    assert bad.value.body()["error"]["param"] == "top_p"
    with pytest.raises(InvalidRequest):
        validated_body("completion", b'{"model":"m","prompt":"x","echo":true}')
    with pytest.raises(InvalidRequest):
        validated_body("chat", b"{not json")
