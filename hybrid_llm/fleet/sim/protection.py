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

from pydantic import BaseModel, Field

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
    release_ms: tuple[float, ...] | None,
    busy_ms_per_seq: float | None,
    prefill_backlog_ms: float,
) -> float | None:
    """A newcomer's wait before its own prefill, as ``AdmissionQueue.predicted_wait_ms``
    prices it: the slot's release (the earliest of ``release_ms``, what the engine
    says its sequences have left) when every slot is held, the busy slowdown of the
    sequences beside it, and the prompts admitted before it. ``None`` (unknown, so
    refused under a budget) when it would queue behind others or the engine cannot
    tell when a slot frees."""
    if running < slots and waiting == 0:
        slot_wait, beside = 0.0, running
    elif waiting or not release_ms:
        return None
    else:
        slot_wait, beside = release_ms[0], slots - 1
    return slot_wait + beside * (busy_ms_per_seq or 0.0) + prefill_backlog_ms
