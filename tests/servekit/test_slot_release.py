import time
from pathlib import Path

import pytest

from servekit.engine.batching import BatchingLlamaEngine, BatchingSettings
from servekit.engine.batching_stats import STEP_SAMPLES, BatchingStats
from servekit.engine.slot_release import (
    MIN_COMPLETIONS,
    TYPICAL_ANSWER_TOKENS,
    left_after_step,
    read_by_step,
    release_ms,
)

RATES = {"prefill_tokens_per_s": 200.0, "decode_step_s": 0.05, "chunk_tokens": 64}


def test_a_long_prompt_frees_its_slot_after_its_prefill_and_answer() -> None:
    # A 400-token document still to prefill, 32 tokens to answer; a question
    # prefilled, 4 tokens from its max_tokens. 200 prompt tokens/s, 50 ms a
    # decode step, 64 prompt tokens a step beside the decoding sequences.
    work = [(400, 32, False), (0, 4, False)]
    got = release_ms(work, typical_tokens=100, shortest_first=True, **RATES)
    # The question's 4 steps carry 4 chunks of the document; the document is
    # read whole, then answered alone.
    assert got == pytest.approx((4 * 64 / 200 * 1000 + 4 * 50.0, 2000.0 + 32 * 50.0))


def test_prefill_ahead_follows_the_engines_order() -> None:
    work = [(300, 1, False), (100, 1, False)]  # the document was admitted first
    # Shortest first: the question's 100 tokens go first, in two steps of 64 (the
    # second reads its last 36 in a first call, 28 of the document's in a second),
    # and its answer's one step carries one more chunk; the document is read
    # whole, then answered.
    short, long = release_ms(work, typical_tokens=100, shortest_first=True, **RATES) or ()
    assert short == pytest.approx((100 + 64) / 200 * 1000 + 50.0)
    assert long == pytest.approx(400 / 200 * 1000 + 50.0)
    # In the work's order: the document's first (a newcomer's own hold is the last).
    in_order = release_ms(work, typical_tokens=100, shortest_first=True, in_order=True, **RATES)
    assert in_order == pytest.approx((long, short))
    # First come first served: the question waits for all of the document; the
    # document's last step (its fifth) reads its last 44 tokens in a first call,
    # 20 of the question's in a second, and its answer's step one more chunk.
    fcfs = release_ms(work, typical_tokens=100, shortest_first=False, **RATES)
    assert fcfs == pytest.approx(((300 + 64) / 200 * 1000 + 50.0, 400 / 200 * 1000 + 50.0))


def test_a_prompts_first_token_waits_for_the_prompts_its_step_finishes() -> None:
    # A 12-token question beside an 86-token one: its first token waits for the
    # one step that reads both (shortest first gives it no step of its own).
    assert read_by_step(12, (12, 86), 128) == 98
    # Beside a prompt the step only begins, it waits for its own tokens: the
    # step reads the other's chunk in a second call.
    assert read_by_step(12, (12, 86), 8) == 12
    assert read_by_step(12, (12, 300), 128) == 12
    # First come first served: its last step also finishes a 20-token prompt
    # admitted after it, in the same first call.
    assert read_by_step(140, (12, 128, 20, 300), 128) == 160
    assert read_by_step(0, (86,), 128) == 0
    # An engine that reads each prompt whole in a step of its own: no rounding.
    work = [(86, 1, False), (12, 1, False)]
    whole = release_ms(
        work, typical_tokens=100, shortest_first=False, **{**RATES, "chunk_tokens": None}
    )
    assert whole == pytest.approx((86 / 200 * 1000 + 12 / 200 * 1000 + 50.0,) * 2)


def test_a_newcomer_waits_for_the_step_in_flight_before_its_own() -> None:
    """It cannot join the step being read: a 51-token question that arrived as an
    idle edge began reading a 258-token prompt's first chunk waited for that chunk
    and its own step, 3.4 s, priced at 1.3 s."""
    assert left_after_step((300, 100, 20), 128) == (292,)
    assert left_after_step((300,), 0) == (300,)
    engine = BatchingLlamaEngine(
        BatchingSettings(model_path=Path("unused.gguf"), model_name="m", chunk_tokens=128)
    )
    stats = engine._stats
    stats.record_step(1, 0, 128, 1.0)  # a prefill rate: 128 tokens/s
    stats.prefill_remaining = (300,)
    stats.step_in_flight = (time.monotonic(), 128)  # its first chunk, just begun
    ahead = engine.prefill_backlog_ahead_ms(12)
    # The rest of the step in flight (~1 s), then its own 12 tokens: its step
    # reads the 172 the long prompt has left in a second call, after its first token.
    assert ahead == pytest.approx(1000.0, abs=60.0)
    stats.step_in_flight = None  # between steps: nothing ahead of its own tokens
    assert engine.prefill_backlog_ahead_ms(12) == pytest.approx(0.0)
    # A 60-token prompt, shorter than the long one's rest, goes before it.
    stats.prefill_remaining = (300, 60)
    assert engine.prefill_backlog_ahead_ms(100) == pytest.approx(60 / 128 * 1000.0)


def test_an_answer_without_max_tokens_is_priced_at_a_typical_length() -> None:
    # No max_tokens: the rest of the slot's context, capped at a typical answer;
    # a max_tokens the client set is taken at its word.
    work = [(0, 1900, True), (0, 1000, False), (0, 20, True)]
    got = release_ms(work, typical_tokens=60, shortest_first=True, **RATES)
    assert got == pytest.approx((20 * 50.0, 60 * 50.0, 1000 * 50.0))


def test_unmeasured_rates_leave_it_unknown() -> None:
    def release(work: list[tuple[int, int, bool]], rate: float | None, step: float | None):
        return release_ms(
            work,
            prefill_tokens_per_s=rate,
            decode_step_s=step,
            chunk_tokens=64,
            typical_tokens=100,
            shortest_first=True,
        )

    assert release([(10, 5, False)], None, 0.05) is None
    assert release([(0, 5, False)], 100.0, None) is None
    assert release([], None, None) == ()


def test_the_stats_measure_a_decode_step_and_a_typical_answer() -> None:
    stats = BatchingStats(slots=4)
    assert stats.decode_step(2) is None
    stats.record_step(2, 2, 0, 0.04, now=0.0)
    stats.record_step(2, 1, 64, 0.5, now=0.1)  # a step that read a chunk is no decode step
    stats.record_step(2, 2, 0, 0.06, now=0.2)
    per_seq = 0.9 * 0.02 + 0.1 * 0.03
    assert stats.decode_step(2) == pytest.approx(2 * per_seq)
    # A batch size not seen yet is priced per sequence: four cost about four of one.
    assert stats.decode_step(4) == pytest.approx(4 * per_seq)
    # Once enough steps of that size are seen, their median prices it.
    for i in range(STEP_SAMPLES):
        stats.record_step(4, 4, 0, 0.1 + 0.01 * i, now=0.3 + i)
    assert stats.decode_step(4) == pytest.approx(0.1 + 0.01 * (STEP_SAMPLES - 1) / 2)
    # A token costs a decoding sequence the time from one step to the next, its
    # sampling and bookkeeping included, not llama_decode's time alone.
    for i in range(4 * STEP_SAMPLES):
        stats.record_step(4, 4, 0, 0.1, now=20.0 + i, period=0.15)
    assert stats.decode_step(4) == pytest.approx(0.15)
    stats.record_completion(4)
    assert stats.typical_completion() == TYPICAL_ANSWER_TOKENS
    for _ in range(MIN_COMPLETIONS):
        stats.record_completion(40)
    assert stats.typical_completion() == pytest.approx((4 + 40 * MIN_COMPLETIONS) / 9)
