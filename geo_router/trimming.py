"""Trimming a long conversation to a token budget: an opt-in policy per tier.

What the field does with histories longer than a model holds: keep the system
prompt(s) and the latest turns that fit, drop the oldest turns in between. The
kept tail starts at a user turn, so no assistant reply or tool result is left
without what it answered. The router applies it only to a tier whose policy
enables it (``routing.trimming``), and only when a request does not fit that
tier's budget; a trimmed route says so (``X-Route-Trimmed`` and explain).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from geo_router.conversation import TEMPLATE_TOKENS_PER_MESSAGE, content_text, estimate_tokens

__all__ = ["Trim", "trim_messages"]

_LEADING = ("system", "developer")


@dataclass(frozen=True, slots=True)
class Trim:
    """The messages to send instead, and what was left out."""

    messages: list[Any]
    dropped: int
    tokens: int  # estimated prompt tokens of what is kept

    def header(self) -> str:
        return f"dropped={self.dropped}; tokens={self.tokens}"


def _tokens(message: Any) -> int:
    text = content_text(message.get("content")) if isinstance(message, Mapping) else ""
    return estimate_tokens(text) + TEMPLATE_TOKENS_PER_MESSAGE


def trim_messages(messages: Sequence[Any], budget_tokens: int) -> Trim | None:
    """The system prompt and the latest turns within ``budget_tokens``.

    ``None`` when nothing needs dropping, or when even the system prompt and
    the last user turn alone exceed the budget (then no trim can make it fit).
    """
    costs = [_tokens(m) for m in messages]
    if sum(costs) <= budget_tokens:
        return None
    head = 0
    while head < len(messages) and _role(messages[head]) in _LEADING:
        head += 1
    used = sum(costs[:head])
    start = len(messages)
    have_user = False
    for i in range(len(messages) - 1, head - 1, -1):
        if have_user and used + costs[i] > budget_tokens:
            break
        used += costs[i]
        start = i
        have_user = have_user or _role(messages[i]) == "user"
    # The kept tail opens with a user turn.
    while start < len(messages) and _role(messages[start]) != "user":
        used -= costs[start]
        start += 1
    if start >= len(messages) or used > budget_tokens or start == head:
        return None
    kept = [*messages[:head], *messages[start:]]
    return Trim(kept, start - head, used)


def _role(message: Any) -> str:
    return str(message.get("role", "")) if isinstance(message, Mapping) else ""
