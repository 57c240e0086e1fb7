"""Going on with an answer elsewhere after its upstream died mid-answer: one rule for all.

The partial answer becomes the end of the prompt:

* a chat request gets it as its final assistant message with
  ``continue_final_message`` (vLLM's parameter, honoured by the project's
  engines). A request that was *already* continuing its final assistant
  message gets the partial text added to that message: a second assistant
  turn would make the model start a new answer after the first;
* a completion request gets it appended to the prompt;
* the token budget shrinks by the tokens already produced. Those are counted
  from what the upstream says about them (:class:`TokenCount`: its ``usage``
  figures, its token ids), not from how many pieces the text came in: one
  streamed chunk may carry several tokens.

The central gateway continues engine requests (``central.continuation``), the
geo router continues wire bodies (``geo_router.continuation``); both use these.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

__all__ = ["TokenCount", "continued_messages", "continued_prompt", "tokens_left"]


def tokens_left(limit: int | None, produced: int) -> int | None:
    """What is left of ``limit`` once ``produced`` tokens are out (``None``: no limit, 0: spent)."""
    return None if limit is None else max(0, limit - produced)


def continued_messages(
    messages: Sequence[Mapping[str, Any]], partial: str, *, continuing: bool
) -> list[dict[str, Any]]:
    """``messages`` ending in the partial answer, as an assistant turn left open.

    ``continuing``: the request already asked to continue its final message.
    """
    out = [dict(m) for m in messages]
    if continuing and out and out[-1].get("role") == "assistant":
        before = out[-1].get("content")
        out[-1]["content"] = (before if isinstance(before, str) else "") + partial
    else:
        out.append({"role": "assistant", "content": partial})
    return out


def continued_prompt(prompt: str | Sequence[str], partial: str) -> str:
    """A completion prompt (a string, or a list of one) followed by the partial answer."""
    return (prompt if isinstance(prompt, str) else prompt[0]) + partial


class TokenCount:
    """Completion tokens of a streamed answer, from its OpenAI events.

    An event's ``usage.completion_tokens`` (vLLM sends one per chunk with
    ``continuous_usage_stats``, every server one at the end) is the count so far;
    a choice's ``token_ids`` (vLLM's ``return_token_ids``) adds its length. A
    choice with text and neither is counted as one token, the least it can be.
    """

    __slots__ = ("tokens",)

    def __init__(self) -> None:
        self.tokens = 0

    def observe(self, event: Mapping[str, Any], text: str | None) -> None:
        """Count one event; ``text`` is what its first choice added to the answer."""
        usage = event.get("usage")
        if isinstance(usage, Mapping):
            reported = usage.get("completion_tokens")
            if isinstance(reported, int) and not isinstance(reported, bool):
                self.tokens = reported
                return
        choices = event.get("choices")
        choice = choices[0] if isinstance(choices, list) and choices else None
        ids = choice.get("token_ids") if isinstance(choice, Mapping) else None
        if isinstance(ids, list):
            self.tokens += len(ids)
        elif text:
            self.tokens += 1
