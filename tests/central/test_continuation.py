"""Building the request that resumes a broken answer elsewhere."""

from __future__ import annotations

from central.continuation import continuation, merged_finish
from servekit.engine.protocol import Finish, GenerationRequest, Message, SamplingParams


def _chat(
    *messages: tuple[str, str], cont: bool = False, limit: int | None = 10
) -> GenerationRequest:
    return GenerationRequest(
        "r",
        SamplingParams(max_tokens=limit, temperature=0.5),
        messages=tuple(Message(role, text) for role, text in messages),
        continue_final_message=cont,
    )


def test_chat_gets_the_partial_answer_as_an_open_assistant_turn() -> None:
    resumed = continuation(_chat(("user", "Hi")), "Hello th", produced=3)
    assert resumed is not None
    assert resumed.messages == (Message("user", "Hi"), Message("assistant", "Hello th"))
    assert resumed.continue_final_message
    assert resumed.sampling.max_tokens == 7
    assert resumed.sampling.temperature == 0.5


def test_an_already_continued_turn_is_extended_not_duplicated() -> None:
    req = _chat(("user", "Hi"), ("assistant", "Well, "), cont=True)
    resumed = continuation(req, "hello", produced=1)
    assert resumed is not None
    assert resumed.messages == (Message("user", "Hi"), Message("assistant", "Well, hello"))


def test_completion_prompt_is_extended() -> None:
    req = GenerationRequest("r", SamplingParams(max_tokens=None), prompt="Once upon")
    resumed = continuation(req, " a time", produced=2)
    assert resumed is not None
    assert resumed.prompt == "Once upon a time"
    assert resumed.sampling.max_tokens is None


def test_spent_budget_means_done() -> None:
    assert continuation(_chat(("user", "Hi"), limit=3), "abc", produced=3) is None


def test_finish_counts_both_parts() -> None:
    merged = merged_finish(Finish("stop", prompt_tokens=15, completion_tokens=4), produced=3)
    assert merged == Finish("stop", prompt_tokens=12, completion_tokens=7)
