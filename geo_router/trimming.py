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

When even the system prompt and the latest user turn exceed the budget (one
pasted document of 10,000 tokens, no history to drop), the latest turn is cut
inside: see :func:`truncate_text` for what is kept and why. Only the latest
user turn and tool results after it are cut, and only string content; when
several are too long, the longest are cut to one common length. The system
prompt is the operator's instruction and is never cut, a partial assistant
answer being continued must keep its end, and a message whose content is a
list of parts (images, audio, several text parts) is left whole: how to cut
one part cannot be judged without knowing what the others cost. When what
may not be cut is over the budget already, nothing is trimmed and the widest
window's own 400 (naming its limit and the prompt's tokens) reaches the client.

:func:`fit_pool` is the planner's one question about windows: which
candidates can take the request, with what prompt.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from geo_router.conversation import TEMPLATE_TOKENS_PER_MESSAGE, content_text, estimate_tokens
from geo_router.routing_settings import TrimSettings
from servekit.registry.protocol import InstanceState, Tier

__all__ = ["Fitted", "Trim", "fit_pool", "trim_messages", "truncate_text"]

_LEADING = ("system", "developer")
_CUTTABLE = ("user", "tool")  # roles whose string content may be cut inside


@dataclass(frozen=True, slots=True)
class Trim:
    """The messages to send instead, and what was left out."""

    messages: list[Any]
    dropped: int
    tokens: int  # estimated prompt tokens of what is kept
    budget: int = 0  # the prompt tokens it was trimmed to fit
    source_len: int = 0  # messages in the conversation it was made from
    truncated: int = 0  # messages cut inside (:func:`truncate_text`)
    omitted_chars: int = 0  # characters those cuts left out

    def apply(self, messages: list[Any]) -> list[Any]:
        """``messages`` trimmed: the kept ones, then whatever was appended after the
        conversation this trim was made from (a continuation's partial answer)."""
        return [*self.messages, *messages[self.source_len :]]

    def header(self) -> str:
        """``X-Route-Trimmed``; a cut inside a message adds ``truncated`` (messages) and
        ``omitted_chars``, so a client sees its message did not reach the model whole."""
        text = f"dropped={self.dropped}; tokens={self.tokens}; budget={self.budget}"
        if self.truncated:
            text += f"; truncated={self.truncated}; omitted_chars={self.omitted_chars}"
        return text

    def to_dict(self) -> dict[str, int]:
        return {
            "dropped_messages": self.dropped,
            "tokens": self.tokens,
            "budget": self.budget,
            "truncated_messages": self.truncated,
            "omitted_chars": self.omitted_chars,
        }


def _tokens(message: Any) -> int:
    text = content_text(message.get("content")) if isinstance(message, Mapping) else ""
    return estimate_tokens(text) + TEMPLATE_TOKENS_PER_MESSAGE


def trim_messages(messages: Sequence[Any], budget_tokens: int) -> Trim | None:
    """The system prompt and the latest turns within ``budget_tokens``.

    When the system prompt and the last user turn (with what follows it) alone
    exceed the budget, that turn is cut inside to fit (:func:`truncate_text`).
    ``None`` when nothing needs dropping, or when no trim can make it fit (no
    user turn, or what may not be cut is already over the budget).
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
    if start >= len(messages):
        return None
    kept = [*messages[:head], *messages[start:]]
    if used <= budget_tokens:  # (so some turn was dropped: the whole did not fit)
        return Trim(kept, start - head, used, budget_tokens, len(messages))
    # Only the latest user turn and what follows it are left, and they do not fit.
    return _cut_tail(kept, head, start - head, budget_tokens, len(messages))


def _cut_tail(
    kept: list[Any], head: int, dropped: int, budget: int, source_len: int
) -> Trim | None:
    """``kept`` with its cuttable tail messages cut to one common level (the longest
    are cut, shorter ones stay whole) so that the whole is within ``budget``."""
    costs = [_tokens(m) for m in kept]
    cuttable = [
        i
        for i in range(head, len(kept))
        if _role(kept[i]) in _CUTTABLE and isinstance(kept[i].get("content"), str)
    ]
    if not cuttable:
        return None
    texts = {i: estimate_tokens(kept[i]["content"]) for i in cuttable}
    room = budget - (sum(costs) - sum(texts.values()))  # for the cuttable texts
    level = _level(sorted(texts.values()), room)
    if level is None:
        return None
    out = list(kept)
    truncated = omitted = 0
    for i in cuttable:
        if texts[i] <= level:
            continue
        cut = truncate_text(kept[i]["content"], level)
        if cut is None:
            return None
        out[i] = {**kept[i], "content": cut[0]}
        truncated += 1
        omitted += cut[1]
    tokens = sum(_tokens(m) for m in out)
    return Trim(out, dropped, tokens, budget, source_len, truncated, omitted)


def _level(sizes: list[int], room: int) -> int | None:
    """The largest cap such that ``sum(min(size, cap)) <= room`` (``sizes``
    ascending; water-filling); ``None`` when there is no room at all."""
    if room < 0:
        return None
    left = len(sizes)
    for size in sizes:
        if size * left <= room:
            room -= size
            left -= 1
        else:
            return room // left
    return sizes[-1] if sizes else room


def _marker(omitted: int) -> str:
    return f"\n[... {omitted} characters omitted ...]\n"


def truncate_text(text: str, max_tokens: int) -> tuple[str, int] | None:
    """``text`` within ``max_tokens`` (by :func:`estimate_tokens`) and the number of
    characters left out, or ``None`` when even the marker alone exceeds it.

    The head and the tail are kept, half the kept characters each, with a marker
    on a line of its own naming what was left out in between
    (``[... N characters omitted ...]``).
    Why the middle: a long message is mostly a pasted document, log or code,
    and the request about it sits before it ("Summarize the following: ...")
    or after it ("... What does this function do?"); keeping only the head
    would lose a trailing question, only the tail a leading instruction. The
    middle of a long input is also what models use least ("Lost in the
    Middle", Liu et al. 2023), and long-context benchmarks cut there for the
    same reasons (LongBench truncates over-long inputs in the middle). The
    marker says, to the model and to anyone reading the prompt, that text is
    missing, so an answer is not given as if the document ended there.
    """
    total = estimate_tokens(text)
    if total <= max_tokens:
        return text, 0
    per_token = len(text) / total  # characters a token, to turn an overshoot into a cut
    keep = len(text) * max_tokens // total

    def kept(keep: int) -> tuple[str, int]:
        front = (keep + 1) // 2
        return text[:front] + _marker(len(text) - keep) + text[len(text) - (keep - front) :], keep

    too_many = len(text)  # keeping this many characters is known to exceed the budget
    while True:
        cut, _ = kept(keep)
        over = estimate_tokens(cut) - max_tokens
        if over <= 0:
            break
        if keep == 0:
            return None
        too_many = keep
        keep = max(0, keep - max(1, math.ceil(over * per_token)))
    # The estimate is not smooth in the characters kept (a cut may split a word):
    # take back what the last step cut too much, as long as it still fits.
    while too_many - keep > 1:
        middle = (keep + too_many) // 2
        if estimate_tokens(kept(middle)[0]) <= max_tokens:
            keep = middle
        else:
            too_many = middle
    cut, keep = kept(keep)
    return cut, len(text) - keep


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
