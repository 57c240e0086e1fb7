"""OpenAI wire types: requests and responses for chat completions and completions.

Requests drop fields they do not declare (``extra="ignore"``): an
engine-native field a client slips in (vLLM's ``ignore_eos``, ``min_tokens``,
``guided_regex``, ``chat_template``, ``priority``, ...) never reaches an
engine through an edge or the center; what an engine should get beyond the
OpenAI surface is the service's setting, not the client's. The router refuses
such fields outright (:func:`unknown_fields`, 400 ``unknown_parameter``),
``cache_salt`` included: edges and the center read it (the router sets it
per tenant: engines reuse cached prefixes only within one salt), clients of
the router cannot.
Invalid values of known fields are refused.
Types are strict: ``"5"`` is not an integer. :func:`parse_request` turns
pydantic's errors into one :class:`~servekit.errors.InvalidRequest` that names
the offending parameter.
"""

from __future__ import annotations

import time
import uuid
from typing import Annotated, Any, Literal, TypeVar

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, ValidationError
from pydantic.json_schema import SkipJsonSchema

from servekit import jsonlimits
from servekit.errors import InvalidRequest

__all__ = [
    "OPENAI_IGNORED",
    "ChatCompletion",
    "ChatCompletionChunk",
    "ChatCompletionRequest",
    "ChatMessage",
    "ChunkChoice",
    "Completion",
    "CompletionChoice",
    "CompletionChunk",
    "CompletionRequest",
    "Delta",
    "FinishReason",
    "ModelCard",
    "ModelList",
    "ResponseMessage",
    "StreamOptions",
    "TextPart",
    "Usage",
    "closed_schema",
    "invalid_from_validation",
    "new_id",
    "now",
    "param_path",
    "parse_request",
    "unknown_fields",
]

FinishReason = Literal["stop", "length"]


def _integral(value: Any) -> Any:
    # JSON Schema counts 5.0 as an integer; strict pydantic would not.
    if isinstance(value, float) and value.is_integer() and abs(value) < 2**63:
        return int(value)
    return value


def _strict_bool(value: Any) -> Any:
    if not isinstance(value, bool):
        raise ValueError("must be a boolean")  # 0 == False must not slip through
    return value


Int = Annotated[int, BeforeValidator(_integral)]
CacheSalt = Annotated[str, Field(min_length=1, max_length=128, pattern=r"^[^@/\\\x00]+$")]
PositiveInt = Annotated[int, Field(ge=1), BeforeValidator(_integral)]
OnlyOne = Annotated[int, Field(ge=1, le=1), BeforeValidator(_integral)]


class _Strict(BaseModel):
    model_config = ConfigDict(strict=True, extra="ignore")


class StreamOptions(_Strict):
    include_usage: bool = False


class TextPart(_Strict):
    type: Literal["text"]
    text: str


class ChatMessage(_Strict):
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[TextPart] | None = None
    name: str | None = None

    def text(self) -> str:
        if self.content is None:
            return ""
        if isinstance(self.content, str):
            return self.content
        return "".join(part.text for part in self.content)


StopField = Annotated[
    str | Annotated[list[str], Field(max_length=4)] | None,
    Field(description="Up to 4 sequences where generation stops; not included in the output."),
]


class _SamplingFields(_Strict):
    model: str = Field(min_length=1, description="Model name, or a routing alias such as 'auto'.")
    max_tokens: PositiveInt | None = Field(None, description="Upper bound on generated tokens.")
    temperature: float | None = Field(None, ge=0.0, le=2.0)
    top_p: float | None = Field(None, ge=0.0, le=1.0)
    n: OnlyOne = Field(1, description="Only one choice per request is supported.")
    stop: StopField = None
    seed: Int | None = Field(
        None, description="Any integer; engines reduce it to their seed width."
    )
    presence_penalty: float | None = Field(None, ge=-2.0, le=2.0)
    frequency_penalty: float | None = Field(None, ge=-2.0, le=2.0)
    stream: bool = False
    stream_options: StreamOptions | None = None
    user: str | None = None
    # The caller's cache scope (the router sets it per tenant; engines reuse cached
    # prefixes only within one). vLLM's limits; never taken from a client: the
    # router refuses it (unknown_fields) and keeps it out of the documented schema.
    cache_salt: SkipJsonSchema[CacheSalt | None] = None

    def stop_list(self) -> list[str]:
        if self.stop is None:
            return []
        stops = [self.stop] if isinstance(self.stop, str) else self.stop
        return [s for s in stops if s]

    def include_usage(self) -> bool:
        return bool(self.stream and self.stream_options and self.stream_options.include_usage)

    def token_limit(self) -> int | None:
        return self.max_tokens


OPENAI_IGNORED = frozenset(
    {
        "logprobs",
        "top_logprobs",
        "logit_bias",
        "response_format",
        "tools",
        "tool_choice",
        "parallel_tool_calls",
        "functions",
        "function_call",
        "metadata",
        "store",
        "service_tier",
        "modalities",
        "audio",
        "prediction",
        "reasoning_effort",
        "web_search_options",
        "best_of",
        "suffix",
    }
)
"""OpenAI request parameters this system accepts and does not implement (dropped)."""


def closed_schema(schema: dict[str, Any]) -> dict[str, Any]:
    """A request model's JSON schema as the router accepts it: the declared fields plus
    :data:`OPENAI_IGNORED`, nothing else (``unknown_fields`` answers 400 for the rest).
    Edges and the center document the model as is: they ignore unknown fields."""
    properties = schema.setdefault("properties", {})
    for name in sorted(OPENAI_IGNORED):
        properties.setdefault(name, {"description": "OpenAI parameter; accepted and ignored."})
    schema["additionalProperties"] = False
    return schema


class ChatCompletionRequest(_SamplingFields):
    messages: list[ChatMessage] = Field(min_length=1)
    max_completion_tokens: PositiveInt | None = None
    # vLLM's parameters, which the router sends to resume a broken stream; kept out of
    # the documented schema (a request that continues needs a final assistant turn).
    continue_final_message: SkipJsonSchema[bool] = False
    add_generation_prompt: SkipJsonSchema[bool] = True

    def token_limit(self) -> int | None:
        # max_completion_tokens supersedes the deprecated max_tokens.
        if self.max_completion_tokens is not None:
            return self.max_completion_tokens
        return self.max_tokens


class CompletionRequest(_SamplingFields):
    prompt: str | Annotated[list[str], Field(min_length=1, max_length=1)] = Field(
        description="The prompt; a list must hold exactly one string."
    )
    echo: Annotated[Literal[False], BeforeValidator(_strict_bool)] = Field(
        False, description="Echoing the prompt is not supported."
    )

    def prompt_text(self) -> str:
        return self.prompt if isinstance(self.prompt, str) else self.prompt[0]


# ---------------------------------------------------------------- responses


class _Out(BaseModel):
    model_config = ConfigDict(extra="allow")


class Usage(_Out):
    prompt_tokens: int = 0
    completion_tokens: int = 0
    total_tokens: int = 0


class ResponseMessage(_Out):
    role: Literal["assistant"] = "assistant"
    content: str | None = None


class ChatChoice(_Out):
    index: int = 0
    message: ResponseMessage
    finish_reason: FinishReason | None
    logprobs: None = None


class ChatCompletion(_Out):
    id: str
    object: Literal["chat.completion"] = "chat.completion"
    created: int
    model: str
    choices: list[ChatChoice]
    usage: Usage | None = None


class Delta(_Out):
    role: Literal["assistant"] | None = None
    content: str | None = None


class ChunkChoice(_Out):
    index: int = 0
    delta: Delta
    finish_reason: FinishReason | None = None
    logprobs: None = None


class ChatCompletionChunk(_Out):
    id: str
    object: Literal["chat.completion.chunk"] = "chat.completion.chunk"
    created: int
    model: str
    choices: list[ChunkChoice]
    usage: Usage | None = None


class CompletionChoice(_Out):
    index: int = 0
    text: str
    finish_reason: FinishReason | None = None
    logprobs: None = None


class Completion(_Out):
    id: str
    object: Literal["text_completion"] = "text_completion"
    created: int
    model: str
    choices: list[CompletionChoice]
    usage: Usage | None = None


class CompletionChunk(Completion):
    """Streamed completions reuse the ``text_completion`` object, as OpenAI does."""


class ModelCard(_Out):
    id: str
    object: Literal["model"] = "model"
    created: int = Field(default_factory=lambda: int(time.time()))
    owned_by: str = "hybrid-llm"


class ModelList(_Out):
    object: Literal["list"] = "list"
    data: list[ModelCard]


# ---------------------------------------------------------------- helpers


def new_id(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:24]}"


def param_path(loc: tuple[int | str, ...]) -> str:
    """Render a pydantic error location the way OpenAI names parameters.

    ``("messages", 0, "content")`` becomes ``messages[0].content``; pydantic's
    union-branch labels (``str``, ``list[str]``, ...) are dropped.
    """
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        elif _is_branch_label(part) or (part == "body" and not out):
            continue
        else:
            out += f".{part}" if out else part
    return out


def _is_branch_label(part: str) -> bool:
    return "[" in part or "-" in part or part in ("str", "int", "float", "bool", "none")


_M = TypeVar("_M", bound=BaseModel)


def parse_request(model: type[_M], raw: bytes | str | dict[str, Any] | Any) -> _M:
    """Validate a request body; raise :class:`InvalidRequest` naming the parameter.

    Raw bodies are decoded by :func:`servekit.jsonlimits.loads` first (depth,
    number and NaN limits) and validated as Python data, as FastAPI does:
    JSON that escapes a lone surrogate is still JSON, which pydantic's own
    JSON parser would refuse. Anything else is taken as already decoded JSON.
    """
    data: Any = jsonlimits.loads(raw) if isinstance(raw, bytes | str) else raw
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        raise invalid_from_validation(exc) from None


def invalid_from_validation(exc: ValidationError) -> InvalidRequest:
    errors = exc.errors(include_url=False)
    if not errors:
        return InvalidRequest("invalid request body")
    first = errors[0]
    if first["type"] in ("json_invalid", "json_type"):
        return InvalidRequest(
            f"request body is not valid JSON: {first['msg']}", code="invalid_json"
        )
    # With unions pydantic reports one error per branch; prefer the most
    # specific location so the message names the real culprit.
    first = max(errors, key=lambda e: len(e["loc"]))
    param = param_path(tuple(first["loc"])) or None
    if first["type"] == "model_type" and not first["loc"]:
        return InvalidRequest("request body must be a JSON object")
    where = f"'{param}'" if param else "request body"
    code = "missing_required_parameter" if first["type"] == "missing" else "invalid_value"
    return InvalidRequest(f"invalid {where}: {first['msg']}", param=param, code=code)


# Fields only this system's services set, though the wire types read them.
_SERVICE_ONLY = frozenset({"cache_salt"})
_ALLOWED = {
    "chat": (frozenset(ChatCompletionRequest.model_fields) | OPENAI_IGNORED) - _SERVICE_ONLY,
    "completion": (frozenset(CompletionRequest.model_fields) | OPENAI_IGNORED) - _SERVICE_ONLY,
}


def unknown_fields(
    kind: Literal["chat", "completion"], body: dict[str, Any]
) -> InvalidRequest | None:
    """The 400 for a top-level field outside the OpenAI surface, or ``None``.

    An engine-native field (``ignore_eos``, ``guided_regex``, ``priority``,
    ``cache_salt``, KV-transfer parameters, ...) is only ever set by this
    system's own services, never taken from a client.
    """
    allowed = _ALLOWED[kind]
    for key in body:
        if key not in allowed:
            return InvalidRequest(
                f"unknown parameter '{key}'", param=str(key), code="unknown_parameter"
            )
    return None


def now() -> int:
    return int(time.time())
