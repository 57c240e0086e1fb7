"""Edge-side protections of TTFT in the simulator, each off unless set.

The simulated edges decode almost all the time, and a new prompt that lands
on an edge whose slots are all held waits for a sequence to finish: seconds,
at ShareGPT answer lengths. Three settings of the simulated edge guard
against that, each the counterpart of a real edge setting:

- ``max_decoders``: at most this many sequences on an edge at once, and no
  queue behind them: a request beyond the cap is refused at once (429) and
  the router places it on its next candidate (a second edge of the region or
  the center). The real edge's engine ``slots`` (vLLM ``max_num_seqs``) with
  ``admission.max_waiting: 0``.
- ``prefill_chunk_tokens``: prompts are prefilled in steps of this many
  tokens, and each step goes to the prompt with the fewest tokens left, so a
  short question waits at most one chunk behind a long document admitted
  before it. The real batching engine's ``chunk_tokens`` with
  ``prefill_order: shortest`` (vLLM: chunked prefill,
  ``max_num_batched_tokens``).
- ``ttft_budget_ms``: the edge refuses at once a request whose predicted TTFT
  there (its wait, predicted as :class:`servekit.admission.AdmissionQueue`
  predicts it, plus its own prefill) is over the budget, and reports the
  budget so the router ranks it last while it would refuse
  (``geo_router.scoring``). The real edge's ``admission.ttft_budget_ms``.
"""

from __future__ import annotations

from collections.abc import Sequence

from pydantic import BaseModel, Field

from servekit.engine.slot_release import release_ms
from servekit.slot_wait import newcomer_wait_ms

__all__ = ["EdgeProtection", "predicted_wait_ms"]


class EdgeProtection(BaseModel):
    """What a simulated edge does to protect its TTFT (``edge_protection:``)."""

    max_decoders: int | None = Field(
        None,
        ge=1,
        description="sequences an edge runs at once (at most its slots); beyond it the edge "
        "refuses at once (no queue) and the router spills the request elsewhere",
    )
    prefill_chunk_tokens: int | None = Field(
        None,
        ge=1,
        description="prompt tokens per prefill step, each step to the prompt with the fewest "
        "tokens left (shortest first); none: one prompt at a time, first come first served",
    )
    ttft_budget_ms: float | None = Field(
        None,
        gt=0,
        description="refuse at once a request whose predicted wait plus own prefill there "
        "exceeds this (servekit.admission's rule), and report it to the router",
    )


def predicted_wait_ms(
    *,
    slots: int,
    running: int,
    waiting: int,
    prefill_left: Sequence[int],
    decoding: int,
    prefill_tokens_per_s: float,
    decode_step_s: float,
    typical_tokens: float,
    chunk_tokens: int | None,
    busy_ms_per_seq: float | None,
) -> float | None:
    """A newcomer's wait before its own prefill, by the admission queue's rule
    (:func:`servekit.slot_wait.newcomer_wait_ms`): when every slot is held, the
    earliest release the engine predicts (``servekit.engine.slot_release``: the
    prompt tokens each of its sequences has left, ``prefill_left``, and for
    ``decoding`` ones and those an answer of unknown length, a typical answer's
    steps); the busy slowdown of the sequences beside it; and the prompt tokens
    admitted before it. ``None`` (unknown, so refused under a budget) when it would
    queue behind others: the simulated queue keeps no hold times."""
    frees_s: list[float] | None = None
    if running >= slots and not waiting:
        unknown = 1 << 30  # no max_tokens: the engine caps it at a typical answer
        work = [(p, unknown, True) for p in prefill_left] + [(0, unknown, True)] * decoding
        releases = release_ms(
            work,
            prefill_tokens_per_s=prefill_tokens_per_s,
            decode_step_s=decode_step_s,
            chunk_tokens=chunk_tokens,
            typical_tokens=typical_tokens,
            shortest_first=chunk_tokens is not None,
        )
        frees_s = None if releases is None else [ms / 1000.0 for ms in releases]
    return newcomer_wait_ms(
        slots=slots,
        running=running,
        ahead=waiting,
        frees_s=frees_s,
        backlog_ms=sum(prefill_left) / prefill_tokens_per_s * 1000.0,
        busy_ms_per_seq=busy_ms_per_seq,
    )
