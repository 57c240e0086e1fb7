"""What the classifier reads of a request: the latest user turn's ask, and its context.

What a request asks is its latest user turn, not its length: a system prompt,
a conversation's history or a pasted document make a request long, yet "What
is my order number?" after them is a lookup. So :func:`read` takes the *ask*
(the latest user turn without pasted material; when the turn is long, its
first and last lines, where people put the question: "Summarize this: <doc>"
or "<doc> Which city is it shipping to?"; fenced code removed) and the
*context* as a few figures (characters of system prompt, history and pasted
text, pasted code, depth, the previous user turn's ask).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from geo_router.conversation import turns_of

__all__ = ["Reading", "read"]

_FENCE = re.compile(r"```.*?(?:```|$)", re.S)
# The ask of a long turn: its first and last lines, each cut to this.
LONG_TURN_CHARS = 300
ASK_LINE_CHARS = 160


@dataclass(frozen=True, slots=True)
class Reading:
    """A request as the classifier sees it."""

    ask: str
    context_chars: int  # system prompt, history and pasted text
    turns: int  # user turns so far, this one included
    has_system: bool
    pasted_code: bool
    prior: str  # the previous user turn's ask ("" when there is none)


def _split_ask(text: str) -> tuple[str, int, bool]:
    """(the ask, characters pasted around it, whether code was pasted)."""
    code = "```" in text
    bare = _FENCE.sub(" ", text) if code else text
    if len(bare) <= LONG_TURN_CHARS:
        return bare.strip(), len(text) - len(bare), code
    lines = [ln.strip() for ln in bare.splitlines() if ln.strip()]
    if len(lines) <= 1:
        ask = bare[:ASK_LINE_CHARS] + " " + bare[-ASK_LINE_CHARS:]
    else:
        ask = lines[0][:ASK_LINE_CHARS] + "\n" + lines[-1][-ASK_LINE_CHARS:]
    return ask, max(0, len(text) - len(ask)), code


def read(body: Mapping[str, Any]) -> Reading:
    """The latest user turn's ask and the figures of its context."""
    turns = turns_of(body)
    users = [i for i, t in enumerate(turns) if t.role == "user"]
    last = users[-1] if users else len(turns) - 1
    text = turns[last].text if turns else ""
    ask, pasted, code = _split_ask(text)
    others = sum(len(t.text) for i, t in enumerate(turns) if i != last)
    prior = _split_ask(turns[users[-2]].text)[0] if len(users) > 1 else ""
    return Reading(
        ask=ask,
        context_chars=others + pasted,
        turns=max(1, len(users)),
        has_system=any(t.role in ("system", "developer") for t in turns),
        pasted_code=code,
        prior=prior,
    )
