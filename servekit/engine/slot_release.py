"""When each running sequence of the batching engine frees its slot.

Admission predicts a queued newcomer's wait from when the slots free
(:meth:`servekit.admission.AdmissionQueue.predicted_wait_ms`). A mean hold
time says a slot held by a 900-token document frees as soon as one held by a
question does; under overload the requests that queued for a slot waited
2.4-3.3 s against a predicted 1.0-1.3 s. The engine knows what each sequence
has left, so it prices that instead:

- prefill: its prompt tokens left, plus what goes before them in the step's
  prefill budget (shortest first: the prompts with no more tokens left than
  its own; first come first served: those admitted before it), and the
  other prompts its last step finishes (:func:`read_by_step`), at the
  measured prefill rate;
- decode: its completion tokens left (its ``max_tokens`` minus those
  generated) times the engine's recent decode step for as many sequences as
  are running (a decoding sequence advances one token per step, and a step of
  four costs about four of one on this CPU: priced at a single stream's step,
  requests queued behind the opening burst waited 3.4 s against a predicted
  1.2 s), plus the other prompts' chunks those steps
  carry (one chunk a step, while any are left to prefill after its own
  prompt), at the prefill rate. A request that sets no ``max_tokens`` may run
  to the end of its slot's context, thousands of tokens, and few answers do:
  its tokens left are capped by a typical answer's length, the mean of the
  recent answers of such requests (their own lengths; an answer cut at a
  client's ``max_tokens`` says nothing of that), :data:`TYPICAL_ANSWER_TOKENS`
  until :data:`MIN_COMPLETIONS` are measured. A ``max_tokens`` a client sets
  is taken at its word: a bench's 32 is exact, and a client that asks for
  4,096 of a 2,048-token slot has its budget cut to the slot already.
"""

from __future__ import annotations

from collections.abc import Sequence

__all__ = [
    "MIN_COMPLETIONS",
    "TYPICAL_ANSWER_TOKENS",
    "left_after_step",
    "read_by_step",
    "release_ms",
]

# A typical answer's length until enough completions are measured: a chat
# answer of a few paragraphs.
TYPICAL_ANSWER_TOKENS = 256
# Completions measured before their mean stands for a typical answer.
MIN_COMPLETIONS = 8


def read_by_step(ahead: int, prompts: Sequence[int], chunk_tokens: int) -> int:
    """Prompt tokens read, ``chunk_tokens`` a step, when the call that reads the
    ``ahead``-th of ``prompts``' tokens (each prompt's tokens left, in the order
    they are read) ends. A prompt's first token waits for that call, and a step
    reads every prompt it finishes in its first call, the chunks of the others in
    a second (``servekit.engine.batching_step``): under overload a 12-token
    question placed beside an 86-token one waited for both (0.9 s), priced as if
    read alone; a question beside a long prompt's chunk no longer waits for it."""
    chunk = max(1, chunk_tokens)
    if ahead <= 0:
        return 0
    step_end = -(-ahead // chunk) * chunk
    read = 0
    for left in prompts:
        if read + left > step_end:
            break
        read += left
    return max(read, ahead)


def left_after_step(remaining: Sequence[int], reading: int) -> tuple[int, ...]:
    """The prompt tokens each prompt has left once the step in flight, which reads
    ``reading`` of them shortest first, has ended (prompts read whole drop out)."""
    out: list[int] = []
    for left in sorted(remaining):
        take = min(left, max(0, reading))
        reading -= take
        if left > take:
            out.append(left - take)
    return tuple(out)


def release_ms(
    work: Sequence[tuple[int, int, bool]],
    *,
    prefill_tokens_per_s: float | None,
    decode_step_s: float | None,
    chunk_tokens: int | None,
    typical_tokens: float,
    shortest_first: bool,
    in_order: bool = False,
) -> tuple[float, ...] | None:
    """Milliseconds until each running sequence frees its slot, ascending (with
    ``in_order``: in ``work``'s order).

    ``work`` holds, per running sequence in admission order, its prompt tokens
    left to prefill, its completion tokens left under its budget, and whether
    its request set no ``max_tokens`` (then they are capped at ``typical_tokens``).
    ``chunk_tokens`` ``None``: an engine that reads each prompt whole in a step
    of its own. ``None`` when a rate it needs is not measured yet.
    """
    prefilling = [p for p, _, _ in work if p > 0]
    order = sorted(prefilling) if shortest_first else prefilling  # as the engine reads them
    total = sum(prefilling)
    if (prefilling and not prefill_tokens_per_s) or (work and not decode_step_s):
        return None
    ms_per_prompt_token = 1000.0 / prefill_tokens_per_s if prefill_tokens_per_s else 0.0
    ms_per_step = (decode_step_s or 0.0) * 1000.0
    out: list[float] = []
    before = 0  # prompt tokens of earlier admissions still to prefill
    for left, decode_left, open_ended in work:
        ahead = 0  # prompt tokens prefilled up to its last one, its own included
        if left > 0:
            first = sum(p for p in prefilling if p <= left) if shortest_first else before + left
            ahead = first if chunk_tokens is None else read_by_step(first, order, chunk_tokens)
            before += left
        steps: float = max(0, decode_left)
        if open_ended:
            steps = min(steps, typical_tokens)
        # Its answer's steps also carry a chunk each of the prompts still to read.
        beside = min(total - ahead, steps * (total if chunk_tokens is None else chunk_tokens))
        out.append((ahead + beside) * ms_per_prompt_token + steps * ms_per_step)
    return tuple(out) if in_order else tuple(sorted(out))
