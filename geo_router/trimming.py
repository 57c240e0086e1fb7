"""Fitting a request into context windows, and trimming a long conversation to a budget.

What the field does with histories longer than a model holds: keep the system
prompt(s) and the latest turns that fit, drop the oldest turns in between. The
kept tail starts at a user turn, so no assistant reply or tool result is left
without what it answered. The router applies it only to a tier whose policy
enables it (``routing.trimming``, per tier and per tenant), and only when a
request does not fit that tier's window (or its ``max_prompt_tokens``); a
``last_resort`` policy waits until no candidate of any tier can hold the whole
conversation. A trim aims at ``window_share`` of the window, less the answer's
tokens (the router's token count is an estimate). A trimmed route says so
(``X-Route-Trimmed`` and explain).

:func:`fit_pool` is the planner's one question about windows: which
candidates can take the request, with what prompt.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from geo_router.conversation import TEMPLATE_TOKENS_PER_MESSAGE, content_text, estimate_tokens
from geo_router.settings import TrimSettings
from servekit.registry.protocol import InstanceState, Tier

__all__ = ["Fitted", "Trim", "fit_pool", "trim_messages"]

_LEADING = ("system", "developer")


@dataclass(frozen=True, slots=True)
class Trim:
    """The messages to send instead, and what was left out."""

    messages: list[Any]
    dropped: int
    tokens: int  # estimated prompt tokens of what is kept
    budget: int = 0  # the prompt tokens it was trimmed to fit
    source_len: int = 0  # messages in the conversation it was made from

    def apply(self, messages: list[Any]) -> list[Any]:
        """``messages`` trimmed: the kept ones, then whatever was appended after the
        conversation this trim was made from (a continuation's partial answer)."""
        return [*self.messages, *messages[self.source_len :]]

    def header(self) -> str:
        return f"dropped={self.dropped}; tokens={self.tokens}; budget={self.budget}"

    def to_dict(self) -> dict[str, int]:
        return {"dropped_messages": self.dropped, "tokens": self.tokens, "budget": self.budget}


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
    return Trim(kept, start - head, used, budget_tokens, len(messages))


def _role(message: Any) -> str:
    return str(message.get("role", "")) if isinstance(message, Mapping) else ""


@dataclass(frozen=True, slots=True)
class Fitted:
    """The candidates that can take a request, each with its prompt tokens and trim."""

    fitted: list[tuple[InstanceState, int, Trim | None]]
    fits: bool  # False: no window holds it, the widest are offered to say so themselves


def fit_pool(
    pool: Sequence[InstanceState],
    tokens: int,
    out_tokens: int,
    messages: list[Any] | None,
    policy: Callable[[Tier], TrimSettings | None],
) -> Fitted:
    """Who can take a request of ``tokens`` estimated prompt tokens and ``out_tokens``
    of answer: an instance whose window holds it whole; or, where ``policy`` of its
    tier trims, with the conversation trimmed. When nobody can, the instances with
    the largest window, untrimmed, so that their own ``context_length_exceeded``
    (naming the window and the prompt's real tokens) reaches the client."""
    whole = {id(s) for s in pool if _holds(s, tokens + out_tokens)}
    fitted: list[tuple[InstanceState, int, Trim | None]] = []
    for state in pool:
        trim = None
        rule = policy(state.info.tier)
        active = rule is not None and rule.enabled and (not rule.last_resort or not whole)
        if messages is not None and rule is not None and active:
            trim = _trim_for(state, tokens, out_tokens, messages, rule)
        if trim is not None:
            fitted.append((state, trim.tokens, trim))
        elif id(state) in whole:
            fitted.append((state, tokens, None))
    if fitted or not pool:
        return Fitted(fitted, True)
    largest = max(s.load.max_context_tokens or 0 for s in pool)
    widest = [s for s in pool if (s.load.max_context_tokens or 0) == largest]
    return Fitted([(s, tokens, None) for s in widest], False)


def _holds(state: InstanceState, total: int) -> bool:
    window = state.load.max_context_tokens
    return window is None or total <= window


def _trim_for(
    state: InstanceState, tokens: int, out_tokens: int, messages: list[Any], rule: TrimSettings
) -> Trim | None:
    """The trim ``rule`` makes for ``state``, or ``None`` when it needs none (or none helps)."""
    window = state.load.max_context_tokens
    cap = rule.max_prompt_tokens
    limit = None if window is None else window - out_tokens
    if cap is not None:
        limit = cap if limit is None else min(limit, cap)
    if limit is None or tokens <= limit:
        return None
    budget = cap
    if window is not None:
        share = int(window * rule.window_share) - out_tokens
        budget = share if budget is None else min(budget, share)
    if budget is None or budget < 1:
        return None
    return trim_messages(messages, budget)
