"""Guessing a job's uncached prompt tokens from its text, before it is tokenized."""

from __future__ import annotations

import dataclasses

from hypothesis import given
from hypothesis import strategies as st

from servekit.engine.prompt_estimate import (
    DEFAULT_CHARS_PER_TOKEN,
    PromptEstimator,
    common_text_prefix,
    request_blocks,
    request_text,
)
from servekit.engine.protocol import GenerationRequest, Message, SamplingParams

SYSTEM = "You are the support assistant of Acme Outdoor. " * 10  # ~470 characters


def chat(*turns: tuple[str, str]) -> GenerationRequest:
    messages = tuple(Message(role, content) for role, content in turns)
    return GenerationRequest("r", SamplingParams(max_tokens=8), messages=messages)


@given(st.text(alphabet="ab相对", max_size=40), st.text(alphabet="ab相对", max_size=40))
def test_common_text_prefix_agrees_with_a_character_loop(a: str, b: str) -> None:
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    assert common_text_prefix(a, b) == n


def test_common_text_prefix_of_long_texts() -> None:
    doc = "The warranty covers parts and labour for two years. " * 400  # ~21k characters
    assert common_text_prefix(doc + "Q: when?", doc + "Q: where?") == len(doc) + 6
    assert common_text_prefix(doc, doc) == len(doc)
    assert common_text_prefix(doc, "X" + doc) == 0
    assert common_text_prefix(doc[:5000] + "a", doc[:5000] + "b") == 5000


def test_request_text_keeps_turns_in_order() -> None:
    text = request_text(chat(("system", "S"), ("user", "Q")))
    assert text.index("S") < text.index("Q")
    assert request_text(GenerationRequest("r", SamplingParams(), prompt="once upon")) == (
        "once upon"
    )


def test_a_cold_prompt_is_priced_whole_at_the_measured_ratio() -> None:
    est = PromptEstimator(slots=2)
    text = request_text(chat(("system", SYSTEM), ("user", "What are your store hours?")))
    assert est.uncached_tokens(text) == -(-len(text) // int(DEFAULT_CHARS_PER_TOKEN))
    est.tokenized("x" * 300, 100)  # this tokenizer: 3 characters a token
    assert est.chars_per_token == 3.0
    assert est.uncached_tokens(text) == -(-len(text) // 3)


def test_the_prefix_a_slot_holds_is_not_priced() -> None:
    est = PromptEstimator(slots=2)
    est.tokenized("x" * 400, 100)
    first = request_text(chat(("system", SYSTEM), ("user", "What are your store hours?")))
    second = request_text(chat(("system", SYSTEM), ("user", "Do you ship to Spain?")))
    cold = est.uncached_tokens(second)
    est.hold(1, first)  # slot 1 now caches the first conversation
    warm = est.uncached_tokens(second)
    assert warm < cold / 10  # only the question is left
    assert warm >= 1
    est.hold(1, "")  # its cache was dropped
    assert est.uncached_tokens(second) == cold


def test_a_slot_still_reading_its_prompt_holds_only_what_it_has_read() -> None:
    """A newcomer sharing the system prompt of one admitted a moment ago copies only
    the part read so far: the rest is priced (counting it all once priced 491-token
    prompts at ~100 ms of prefill, and they took 5 s)."""
    est = PromptEstimator(slots=2)
    est.tokenized("x" * 400, 100)
    first = request_text(chat(("system", SYSTEM), ("user", "What are your store hours?")))
    second = request_text(chat(("system", SYSTEM), ("user", "Do you ship to Spain?")))
    cold = est.uncached_tokens(second)
    est.hold(1, first, read=0.0)  # admitted, nothing read yet
    assert est.uncached_tokens(second) == cold
    est.prefilled(1, 0.5)
    assert cold / 3 < est.uncached_tokens(second) < 2 * cold / 3
    est.prefilled(1, 1.0)
    assert est.uncached_tokens(second) < cold / 10
    est.hold(0, second, read=1.0)
    est.hold(1, "")
    assert est.uncached_tokens(first) < cold / 10


def test_the_ratio_follows_a_change_of_language() -> None:
    est = PromptEstimator(slots=1)
    for _ in range(5):
        est.tokenized("word " * 80, 100)  # 4 characters a token
    for _ in range(30):
        est.tokenized("相对论的核心思想" * 10, 80)  # 1 character a token
    assert est.chars_per_token < 1.2


def test_another_scopes_held_prompt_does_not_lower_the_price() -> None:
    est = PromptEstimator(2)
    text = request_text(chat(("system", SYSTEM), ("user", "hi")))
    est.hold(0, text, salt="acme")
    assert est.uncached_tokens(text, "acme") == 1
    cold = est.uncached_tokens(text, "evil")
    assert cold == est.uncached_tokens(text, None) >= len(SYSTEM) / DEFAULT_CHARS_PER_TOKEN


def test_block_names_are_the_requests_scopes() -> None:
    request = chat(("system", SYSTEM), ("user", "hi"))
    salted = dataclasses.replace(request, cache_salt="acme")
    plain, acme = request_blocks(request, 64), request_blocks(salted, 64)
    assert len(plain) == len(acme) > 5
    assert not set(plain) & set(acme)


def test_a_finished_slot_holds_its_answer_as_the_next_turns_history() -> None:
    """A next turn sends the answer back: a slot keeps the answer's tokens, so the
    turn is priced at its new message alone, and the load report names the answer's
    blocks as a router names the next turn's history."""
    est = PromptEstimator(1, block_chars=64)
    opening = (("system", SYSTEM), ("user", "Can I return boots?"))
    first = chat(*opening)
    answer = "Yes: within 30 days, unworn, with the receipt. " * 3
    est.hold(0, request_text(first), request_blocks(first, 64))
    est.answered(0, first, answer)
    follow_up = "And if I lost the receipt?"
    second = chat(*opening, ("assistant", answer), ("user", follow_up))
    new = len(request_text(second)) - len(request_text(first)) - len(f"\nassistant\n{answer}")
    assert est.uncached_tokens(request_text(second)) == -(-new // int(DEFAULT_CHARS_PER_TOKEN))
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
    est = PromptEstimator(1)
    partial = chat(("user", "Tell me a story."), ("assistant", "Once upon a time"))
    partial = dataclasses.replace(partial, continue_final_message=True)
    est.answered(0, partial, ", a fox lived in the woods.")
    whole = chat(("user", "Tell me a story."), ("assistant", "Once upon a time, a fox lived"))
    assert est.uncached_tokens(request_text(whole)) == 1


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
