from __future__ import annotations

import json

from geo_router.continuation import Transcript, assemble, without_usage
from geo_router.region import ResolvedRegion
from geo_router.request import RouteRequest, continued
from servekit.sse import DONE_FRAME


def _chunk(text: str | None = None, role: bool = False, finish: str | None = None) -> dict:  # type: ignore[type-arg]
    delta = {"role": "assistant"} if role else {}
    if text is not None:
        delta["content"] = text
    choice = {"index": 0, "delta": delta, "finish_reason": finish}
    return {"id": "orig", "model": "m", "created": 5, "choices": [choice]}


def _request(body: dict, kind: str = "chat") -> RouteRequest:  # type: ignore[type-arg]
    region = ResolvedRegion("east", "default", None)
    return RouteRequest(body, kind, "/v1/chat/completions", region, "u", {}, 0.0)  # type: ignore[arg-type]


def continuation_body(body: dict, s: Transcript, kind: str = "chat") -> dict | None:  # type: ignore[type-arg]
    req = continued(_request(body, kind), s.partial())
    return None if req is None else req.body


def test_chat_continuation_appends_partial_and_shrinks_the_budget() -> None:
    s = Transcript("chat")
    for e in (_chunk(role=True), _chunk("Hello"), _chunk(" world")):
        s.observe(e)
    body = {"model": "auto", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 10}
    out = continuation_body(body, s)
    assert out is not None
    assert out["messages"][-1] == {"role": "assistant", "content": "Hello world"}
    assert (out["continue_final_message"], out["add_generation_prompt"]) == (True, False)
    assert out["max_tokens"] == 8
    assert body["max_tokens"] == 10  # the original is untouched
    assert continuation_body({**body, "max_tokens": 2}, s) is None


def test_completion_continuation_extends_the_prompt() -> None:
    s = Transcript("completion")
    s.observe({"id": "x", "choices": [{"text": " two"}]})
    out = continuation_body({"model": "m", "prompt": ["one"]}, s, "completion")
    assert out is not None
    assert out["prompt"] == "one two"


def test_rewrite_makes_the_continuation_part_of_the_original_stream() -> None:
    s = Transcript("chat")
    s.observe(_chunk("a"))
    other = {**_chunk(role=True), "id": "new", "model": "other", "created": 9}
    assert s.splice(other, 1) is None  # the continuation's role chunk is dropped
    frame = s.splice({**_chunk("b"), "id": "new", "model": "other"}, 1)
    assert frame is not None
    event = json.loads(frame[6:])
    assert (event["id"], event["model"], event["created"]) == ("orig", "m", 5)
    usage = {"id": "new", "choices": [], "usage": {"prompt_tokens": 4, "completion_tokens": 2}}
    usage_frame = s.splice(usage, 1)
    assert usage_frame is not None
    assert json.loads(usage_frame[6:])["usage"] == {
        "prompt_tokens": 4,
        "completion_tokens": 3,
        "total_tokens": 7,
    }


def test_assemble_builds_the_non_streamed_shape() -> None:
    s = Transcript("chat")
    for e in (_chunk(role=True), _chunk("ok"), _chunk(finish="length")):
        s.observe(e)
    out = assemble(s)
    assert out["object"] == "chat.completion"
    assert out["choices"][0]["message"] == {"role": "assistant", "content": "ok"}
    assert out["choices"][0]["finish_reason"] == "length"


def test_a_client_that_asked_no_usage_gets_none() -> None:
    finish = b'data: {"id":"c","choices":[{"index":0,"delta":{},"finish_reason":"stop"}]}\n\n'
    usage = b'data: {"id":"c","choices":[],"usage":{"prompt_tokens":3,"total_tokens":5}}\n\n'
    assert without_usage(finish) is finish  # no usage: untouched, not re-encoded
    assert without_usage(usage) == b""
    out = without_usage(finish + usage + DONE_FRAME)
    assert out.endswith(DONE_FRAME)
    assert b"usage" not in out
    assert b'"finish_reason":"stop"' in out
    continuous = b'data: {"choices":[{"index":0,"text":"a"}],"usage":{"total_tokens":4}}\n\n'
    assert without_usage(continuous) == b'data: {"choices":[{"index":0,"text":"a"}]}\n\n'
