"""Continuing a generation on another replica after its replica died mid-answer.

The rule (the partial answer becomes the prompt's end, the budget shrinks by
the tokens produced) is ``servekit.continuation``'s, shared with the geo
router, which does the same at the wire level across instances. The client
sees one answer.
"""

from __future__ import annotations

import dataclasses

from servekit.continuation import continued_messages, continued_prompt, tokens_left
from servekit.engine.protocol import Finish, GenerationRequest, Message

__all__ = ["continuation", "merged_finish"]


def continuation(
    request: GenerationRequest, partial: str, produced: int
) -> GenerationRequest | None:
    """The request that goes on from ``partial``; None when its token budget is spent."""
    left = tokens_left(request.sampling.max_tokens, produced)
    if left == 0:
        return None
    sampling = dataclasses.replace(request.sampling, max_tokens=left)
    if request.messages is None:
        prompt = continued_prompt(request.prompt or "", partial)
        return dataclasses.replace(request, prompt=prompt, sampling=sampling)
    wire = [{"role": m.role, "content": m.content} for m in request.messages]
    turns = continued_messages(wire, partial, continuing=request.continue_final_message)
    messages = tuple(Message(m["role"], m["content"]) for m in turns)
    return dataclasses.replace(
        request, messages=messages, sampling=sampling, continue_final_message=True
    )


def merged_finish(finish: Finish, produced: int) -> Finish:
    """The continuation's finish, counted as if one replica had produced it all."""
    return Finish(
        finish.reason,
        prompt_tokens=max(0, finish.prompt_tokens - produced),
        completion_tokens=finish.completion_tokens + produced,
        cached_prompt_tokens=finish.cached_prompt_tokens,
    )
