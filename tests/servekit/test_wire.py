from __future__ import annotations

import pytest

from servekit.engine.protocol import GenerationRequest
from servekit.errors import InvalidRequest
from servekit.wire import ChatCompletionRequest, CompletionRequest, parse_request, unknown_fields


def chat(**fields: object) -> dict[str, object]:
    body: dict[str, object] = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
    body.update(fields)
    return body


ENGINE_NATIVE = {
    "ignore_eos": True,
    "min_tokens": 500,
    "guided_regex": "(a+)+$",
    "chat_template": "{{ 7 * 7 }}",
    "priority": -100,
    "cache_salt": "victim",
    "kv_transfer_params": {"remote_host": "10.0.0.1"},
}


def test_engine_native_fields_are_dropped_not_forwarded() -> None:
    body = chat(**ENGINE_NATIVE)
    body["messages"] = [{"role": "user", "content": "hi", "chat_template": "x"}]
    req = parse_request(ChatCompletionRequest, body)
    assert req.model_extra is None
    assert req.messages[0].model_extra is None
    generation = GenerationRequest.from_chat(req, "r")
    assert generation.extra == {}
    text = parse_request(CompletionRequest, {"model": "m", "prompt": "x", **ENGINE_NATIVE})
    assert GenerationRequest.from_completion(text, "r").extra == {}


@pytest.mark.parametrize("field", ENGINE_NATIVE)
def test_the_router_refuses_engine_native_fields(field: str) -> None:
    for kind in ("chat", "completion"):
        refused = unknown_fields(kind, {"model": "m", field: ENGINE_NATIVE[field]})
        assert refused is not None
        assert (refused.status, refused.code, refused.param) == (400, "unknown_parameter", field)


def test_edges_read_the_routers_cache_salt_within_vllms_limits() -> None:
    # The router sets it per tenant (and refuses a client's: above); edges and the
    # center take it into the engine request, which reuses caches only within one.
    salt = "ab" * 32
    chat_req = parse_request(ChatCompletionRequest, chat(cache_salt=salt))
    assert GenerationRequest.from_chat(chat_req, "r").cache_salt == salt
    text = parse_request(CompletionRequest, {"model": "m", "prompt": "x", "cache_salt": salt})
    assert GenerationRequest.from_completion(text, "r").cache_salt == salt
    assert (
        GenerationRequest.from_chat(parse_request(ChatCompletionRequest, chat()), "r").cache_salt
        is None
    )
    for bad in ("", "a/b", "a@b", "x" * 129, 7):
        with pytest.raises(InvalidRequest):
            parse_request(ChatCompletionRequest, chat(cache_salt=bad))
    assert "cache_salt" not in ChatCompletionRequest.model_json_schema()["properties"]


def test_the_openai_surface_passes_the_field_check() -> None:
    body = chat(stream=True, stream_options={"include_usage": True}, logprobs=False, user="u")
    assert unknown_fields("chat", body) is None
    assert unknown_fields("chat", chat(continue_final_message=True)) is None
    assert unknown_fields("completion", {"model": "m", "prompt": "p", "echo": False}) is None


@pytest.mark.parametrize(
    ("fields", "param"),
    [
        ({"max_tokens": -1}, "max_tokens"),
        ({"max_tokens": 0}, "max_tokens"),
        ({"max_tokens": "5"}, "max_tokens"),
        ({"max_tokens": 5.5}, "max_tokens"),
        ({"max_tokens": True}, "max_tokens"),
        ({"temperature": 3}, "temperature"),
        ({"temperature": "hot"}, "temperature"),
        ({"top_p": 1.5}, "top_p"),
        ({"n": 2}, "n"),
        ({"stop": ["a", "b", "c", "d", "e"]}, "stop"),
        ({"stream": "yes"}, "stream"),
        ({"stream_options": {"include_usage": "yes"}}, "stream_options.include_usage"),
        ({"messages": []}, "messages"),
        ({"messages": [{"role": "robot", "content": "x"}]}, "messages[0].role"),
        ({"messages": [{"content": "x"}]}, "messages[0].role"),
        ({"model": ""}, "model"),
        ({"max_completion_tokens": 0}, "max_completion_tokens"),
    ],
)
def test_invalid_values_name_the_parameter(fields: dict[str, object], param: str) -> None:
    with pytest.raises(InvalidRequest) as info:
        parse_request(ChatCompletionRequest, chat(**fields))
    assert info.value.param == param
    assert info.value.status == 400
    assert info.value.body()["error"]["param"] == param


def test_missing_model_is_named() -> None:
    with pytest.raises(InvalidRequest) as info:
        parse_request(ChatCompletionRequest, {"messages": [{"role": "user", "content": "x"}]})
    assert info.value.param == "model"
    assert info.value.code == "missing_required_parameter"


def test_malformed_json_and_non_object() -> None:
    with pytest.raises(InvalidRequest) as info:
        parse_request(ChatCompletionRequest, b"{not json")
    assert info.value.code == "invalid_json"
    with pytest.raises(InvalidRequest):
        parse_request(ChatCompletionRequest, b"[1, 2]")


def test_max_completion_tokens_supersedes_max_tokens() -> None:
    req = parse_request(ChatCompletionRequest, chat(max_tokens=10, max_completion_tokens=3))
    assert req.token_limit() == 3
    assert parse_request(ChatCompletionRequest, chat(max_tokens=10)).token_limit() == 10


def test_text_parts_and_stop_forms() -> None:
    req = parse_request(
        ChatCompletionRequest,
        chat(
            messages=[
                {
                    "role": "user",
                    "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}],
                }
            ],
            stop="x",
        ),
    )
    assert req.messages[0].text() == "ab"
    assert req.stop_list() == ["x"]
    assert parse_request(ChatCompletionRequest, chat(stop=["", "y"])).stop_list() == ["y"]


def test_include_usage_only_when_streaming() -> None:
    opts = {"stream_options": {"include_usage": True}}
    assert parse_request(ChatCompletionRequest, chat(stream=True, **opts)).include_usage()
    assert not parse_request(ChatCompletionRequest, chat(**opts)).include_usage()


def test_completion_prompt_forms() -> None:
    one = parse_request(CompletionRequest, {"model": "m", "prompt": ["only"]})
    assert one.prompt_text() == "only"
    with pytest.raises(InvalidRequest) as info:
        parse_request(CompletionRequest, {"model": "m", "prompt": ["a", "b"]})
    assert info.value.param == "prompt"
    with pytest.raises(InvalidRequest) as info:
        parse_request(CompletionRequest, {"model": "m", "prompt": [1, 2]})
    assert info.value.param is not None
    assert info.value.param.startswith("prompt")
    with pytest.raises(InvalidRequest) as info:
        parse_request(CompletionRequest, {"model": "m", "prompt": "x", "echo": True})
    assert info.value.param == "echo"


def test_json_escaping_a_lone_surrogate_is_still_json() -> None:
    # Valid JSON grammar, not valid UTF-16: FastAPI accepted it, so must the plain-ASGI path.
    raw = rb'{"model": "m", "messages": [{"role": "user", "content": "a\ud800b"}]}'
    req = parse_request(ChatCompletionRequest, raw)
    assert req.messages[0].content == "a\ud800b"


@pytest.mark.parametrize("decoded", [[None, None], 3, None, True])
def test_already_decoded_non_objects_are_a_400(decoded: object) -> None:
    with pytest.raises(InvalidRequest, match="JSON object"):
        parse_request(ChatCompletionRequest, decoded)
