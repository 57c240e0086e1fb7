"""Building OpenAI response bodies and stream chunks from engine events.

Stream chunks are the hot path (one per token), so their JSON is assembled
from a prefix computed once per request instead of through a model dump.
"""

from __future__ import annotations

import json
from typing import Any, Literal

from servekit.engine.protocol import Finish

__all__ = ["FrameBuilder", "usage_dict"]


def usage_dict(finish: Finish) -> dict[str, Any]:
    usage: dict[str, Any] = {
        "prompt_tokens": finish.prompt_tokens,
        "completion_tokens": finish.completion_tokens,
        "total_tokens": finish.prompt_tokens + finish.completion_tokens,
    }
    if finish.cached_prompt_tokens:
        usage["prompt_tokens_details"] = {"cached_tokens": finish.cached_prompt_tokens}
    return usage


def _dumps(obj: Any) -> str:
    return json.dumps(obj, ensure_ascii=False, separators=(",", ":"))


class FrameBuilder:
    """Chunks and whole responses for one request, chat or text completion."""

    def __init__(
        self, kind: Literal["chat", "completion"], request_id: str, model: str, created: int
    ) -> None:
        self.kind = kind
        self.request_id = request_id
        self.model = model
        self.created = created
        obj = "chat.completion.chunk" if kind == "chat" else "text_completion"
        self._head = (
            f'{{"id":{_dumps(request_id)},"object":"{obj}","created":{created},'
            f'"model":{_dumps(model)},"choices":['
        )

    def _frame(self, body: str) -> bytes:
        return b"data: " + body.encode("utf-8", errors="replace") + b"\n\n"

    def role(self) -> bytes | None:
        if self.kind != "chat":
            return None
        return self._frame(
            self._head + '{"index":0,"delta":{"role":"assistant","content":""},'
            '"finish_reason":null,"logprobs":null}]}'
        )

    def delta(self, text: str) -> bytes:
        if self.kind == "chat":
            choice = f'{{"index":0,"delta":{{"content":{_dumps(text)}}},"finish_reason":null,'
        else:
            choice = f'{{"index":0,"text":{_dumps(text)},"finish_reason":null,'
        return self._frame(self._head + choice + '"logprobs":null}]}')

    def finish(self, reason: str) -> bytes:
        if self.kind == "chat":
            choice = f'{{"index":0,"delta":{{}},"finish_reason":"{reason}",'
        else:
            choice = f'{{"index":0,"text":"","finish_reason":"{reason}",'
        return self._frame(self._head + choice + '"logprobs":null}]}')

    def usage(self, finish: Finish) -> bytes:
        return self._frame(self._head + '],"usage":' + _dumps(usage_dict(finish)) + "}")

    def whole(self, text: str, finish: Finish) -> dict[str, Any]:
        if self.kind == "chat":
            choice: dict[str, Any] = {
                "index": 0,
                "message": {"role": "assistant", "content": text},
                "finish_reason": finish.reason,
                "logprobs": None,
            }
            obj = "chat.completion"
        else:
            choice = {"index": 0, "text": text, "finish_reason": finish.reason, "logprobs": None}
            obj = "text_completion"
        return {
            "id": self.request_id,
            "object": obj,
            "created": self.created,
            "model": self.model,
            "choices": [choice],
            "usage": usage_dict(finish),
        }
