"""What the batching engine's slots hold, as its load report names it to routers."""

from __future__ import annotations

import dataclasses

from servekit.engine.prompt_estimate import PromptEstimator, request_blocks, request_text
from servekit.engine.protocol import GenerationRequest, Message, SamplingParams

SYSTEM = "You are the support assistant of Acme Outdoor. " * 10  # ~470 characters


def chat(*turns: tuple[str, str]) -> GenerationRequest:
    messages = tuple(Message(role, content) for role, content in turns)
    return GenerationRequest("r", SamplingParams(max_tokens=8), messages=messages)


def test_request_text_keeps_turns_in_order() -> None:
    text = request_text(chat(("system", "S"), ("user", "Q")))
    assert text.index("S") < text.index("Q")
    assert request_text(GenerationRequest("r", SamplingParams(), prompt="once upon")) == (
        "once upon"
    )


def test_block_names_are_the_requests_scopes() -> None:
    request = chat(("system", SYSTEM), ("user", "hi"))
    salted = dataclasses.replace(request, cache_salt="acme")
    plain, acme = request_blocks(request, 64), request_blocks(salted, 64)
    assert len(plain) == len(acme) > 5
    assert not set(plain) & set(acme)


def test_a_finished_slot_holds_its_answer_as_the_next_turns_history() -> None:
    """A next turn sends the answer back: a slot keeps the answer's tokens, so the
    load report names the answer's blocks as a router names the next turn's history."""
    est = PromptEstimator(1, block_chars=64)
    opening = (("system", SYSTEM), ("user", "Can I return boots?"))
    first = chat(*opening)
    answer = "Yes: within 30 days, unworn, with the receipt. " * 3
    est.hold(0, request_text(first), request_blocks(first, 64))
    est.answered(0, first, answer)
    follow_up = "And if I lost the receipt?"
    second = chat(*opening, ("assistant", answer), ("user", follow_up))
    held = set(est.held_blocks(1))
    history = request_blocks(second, 64)
    answered_through = len(request_blocks(chat(*opening, ("assistant", answer)), 64))
    assert answered_through > len(request_blocks(first, 64))
    assert set(history[:answered_through]) <= held
    assert not set(history[answered_through:]) & held
    # Sampled every fourth block, the prompt's own end is named too: a repeat of the
    # first turn is vouched for whole, not to the sample before its end.
    assert request_blocks(first, 64)[-1] in est.held_blocks(4)


def test_a_continued_answer_is_held_within_its_own_turn() -> None:
    est = PromptEstimator(1, block_chars=16)
    partial = chat(("user", "Tell me a story."), ("assistant", "Once upon a time"))
    partial = dataclasses.replace(partial, continue_final_message=True)
    est.answered(0, partial, ", a fox lived in the woods by the river.")
    story = "Once upon a time, a fox lived in the woods by the river."
    whole = chat(("user", "Tell me a story."), ("assistant", story))
    assert est.held_blocks(1) == request_blocks(whole, 16)


def test_the_report_names_a_prompt_only_as_far_as_its_slot_has_read_it() -> None:
    """A hedged attempt cancelled mid-prefill must not leave routers believing the
    edge holds the prompt: its report named the whole customer-service prompt while
    it read the first chunk, and nine requests went there first, to lose to a hedge."""
    est = PromptEstimator(1, block_chars=64)
    request = chat(("system", SYSTEM), ("user", "Can I return boots?"))
    blocks = request_blocks(request, 64)
    est.hold(0, request_text(request), blocks, read=0.25)
    held = est.held_blocks(1)
    assert 0 < len(held) <= len(blocks) // 4
    assert set(held) <= set(blocks[: len(blocks) // 4])
    est.prefilled(0, 1.0)
    assert est.held_blocks(1) == blocks
