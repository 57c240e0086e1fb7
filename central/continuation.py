"""Continuing a generation on another replica after its replica died mid-answer.

The partial answer becomes the prompt's end: chat requests get it as a final
assistant message with ``continue_final_message`` (vLLM's parameter, honoured
by the project's engines), completions get it appended to the prompt, and
``max_tokens`` shrinks by what was already produced. The client sees one
answer; the geo router does the same at the wire level across instances.
"""

from __future__ import annotations

import dataclasses

from servekit.engine.protocol import Finish, GenerationRequest, Message

__all__ = ["continuation", "merged_finish"]


def continuation(
    request: GenerationRequest, partial: str, produced: int
) -> GenerationRequest | None:
    """The request that goes on from ``partial``; None when its token budget is spent."""
    limit = request.sampling.max_tokens
    left = None if limit is None else limit - produced
    if left is not None and left <= 0:
        return None
    sampling = dataclasses.replace(request.sampling, max_tokens=left)
    if request.messages is None:
        prompt = (request.prompt or "") + partial
        return dataclasses.replace(request, prompt=prompt, sampling=sampling)
    messages = list(request.messages)
    if request.continue_final_message and messages and messages[-1].role == "assistant":
        messages[-1] = Message("assistant", messages[-1].content + partial)
    else:
        messages.append(Message("assistant", partial))
    return dataclasses.replace(
        request, messages=tuple(messages), sampling=sampling, continue_final_message=True
    )


def merged_finish(finish: Finish, produced: int) -> Finish:
    """The continuation's finish, counted as if one replica had produced it all."""
    return Finish(
        finish.reason,
        prompt_tokens=max(0, finish.prompt_tokens - produced),
        completion_tokens=finish.completion_tokens + produced,
        cached_prompt_tokens=finish.cached_prompt_tokens,
    )
