"""What the router reads from a request body: its turns, its size, its output budget.

One home for walking an OpenAI body's ``messages`` (or ``prompt``): the
classifier, the planner (token estimate, context fit, trimming) and the
prefix index all read a request through :func:`turns_of`.

Token counts are estimates from characters, since the router holds no
tokenizer: about 4 characters a token for Latin text (BPE tokenizers on
English), about one token per CJK character, and a few tokens per message for
the chat template's role markers.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

__all__ = [
    "Turn",
    "content_text",
    "estimate_prompt_tokens",
    "estimate_tokens",
    "output_budget",
    "turns_of",
]

_CJK = re.compile(r"[\u3000-\u9fff\uac00-\ud7af\uff00-\uffef]")
TEMPLATE_TOKENS_PER_MESSAGE = 4


@dataclass(frozen=True, slots=True)
class Turn:
    role: str
    text: str


def content_text(content: Any) -> str:
    """The text of a message's ``content`` (a string, or a list of parts)."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(
            str(p.get("text", "")) for p in content if isinstance(p, Mapping) and "text" in p
        )
    return ""


def turns_of(body: Mapping[str, Any]) -> list[Turn]:
    """The conversation in order; a completion's prompt is one ``user`` turn."""
    messages = body.get("messages")
    if isinstance(messages, Sequence) and not isinstance(messages, str):
        return [
            Turn(str(m.get("role", "")), content_text(m.get("content")))
            for m in messages
            if isinstance(m, Mapping)
        ]
    prompt = body.get("prompt")
    if isinstance(prompt, list):
        prompt = "".join(p for p in prompt if isinstance(p, str))
    return [Turn("user", prompt)] if isinstance(prompt, str) else []


def estimate_tokens(text: str) -> int:
    """Tokens in ``text``: CJK characters count one each, other text 4 characters a token."""
    cjk = len(_CJK.findall(text)) if not text.isascii() else 0
    return cjk + (len(text) - cjk + 3) // 4


def estimate_prompt_tokens(body: Mapping[str, Any], turns: Sequence[Turn] | None = None) -> int:
    """The prompt's tokens, template markers included (at least 1); ``turns`` are
    :func:`turns_of` the body when the caller has them already."""
    turns = turns_of(body) if turns is None else turns
    overhead = TEMPLATE_TOKENS_PER_MESSAGE * len(turns) if "messages" in body else 0
    return max(1, sum(estimate_tokens(t.text) for t in turns) + overhead)


def output_budget(body: Mapping[str, Any]) -> int | None:
    """The client's ``max_completion_tokens`` / ``max_tokens``, if it set one."""
    for key in ("max_completion_tokens", "max_tokens"):
        value = body.get(key)
        if isinstance(value, int) and not isinstance(value, bool) and value > 0:
            return value
    return None
