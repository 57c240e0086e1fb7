"""How long a request arriving now waits before its own prefill begins.

One rule, priced the same by the admission queue in front of a real engine
(:class:`servekit.admission.AdmissionQueue`) and by the simulator's edges
(``hybrid_llm.fleet.sim.instance``):

- slot wait: with ``k`` requests waiting ahead and every slot held, a
  newcomer gets the slot freed by the ``k+1``-th release. Slot ``i`` frees
  after ``r_i``: what the engine says its sequence has left (prompt tokens
  left at the prefill rate plus answer tokens left at the decode rate,
  ``servekit.engine.slot_release``); for a request admitted but not yet
  running in it, what the engine expected of it when it was admitted (its
  own hold: its prompt and answer budget beside the sequences running then;
  the recent mean hold, measured while a single stream warmed up, priced an
  opening burst's slots at a third of the 3.4 s they were held); or, for an
  engine that cannot tell, the recent mean hold time ``h`` less how long it
  has held it. A mean hold says a slot held by a long document frees as soon
  as one held by a question: queued requests waited 2.4-3.3 s against a
  predicted 1.0-1.3 s. Each waiter ahead takes the earliest free slot and
  frees it again ``h`` later (:func:`slot_frees_s`). When that needs ``h``
  and no request has released its slot yet, the wait is unknown (``None``):
  under a budget such a request is refused (a cold edge that queued a burst
  behind a guessed hold time made it wait many seconds, and the router's
  deadline cut it);
- busy slowdown: the sequences running beside it once it has a slot, times
  the engine's measured cost of one (``busy_ms_per_seq``);
- prefill backlog: the prompt tokens the engine has admitted but not yet
  prefilled that go before the newcomer's, at its measured prefill rate.
  Without it a burst of cold prompts (every slot prefilling a long system
  prompt at once) is admitted at a predicted wait of zero and each later
  arrival waits seconds behind them. A newcomer that must queue for a slot
  waits for the larger of its slot wait and this backlog, not their sum:
  the engine's slot releases already include the prefill their sequences
  have left, and by the time a slot frees the prompts ahead are partly read
  (the sum over-predicted and refused requests that would have made it).

A request's predicted TTFT is this wait plus its own prefill.
"""

from __future__ import annotations

import heapq
from collections.abc import Sequence

__all__ = ["newcomer_wait_ms", "slot_frees_s"]


def slot_frees_s(
    *,
    slots: int,
    engine_s: Sequence[float],
    guessed: Sequence[tuple[float | None, float]],
    ahead: int,
    mean_hold_s: float | None,
) -> list[float] | None:
    """Seconds until each slot frees once ``ahead`` waiters have each taken the
    earliest free one (a heap: the first is the slot a newcomer behind them gets).

    ``engine_s``: the releases the engine predicts for the sequences it runs;
    ``guessed``: the other held slots, each ``(hold_s, held_s)``: its own expected
    hold (``None``: the mean hold) and how long it has held the slot. ``None`` when
    that needs the mean hold and none is measured."""
    if (ahead or any(h is None for h, _ in guessed)) and mean_hold_s is None:
        return None
    hold = mean_hold_s or 0.0
    left = list(engine_s) + [max(0.0, (h if h is not None else hold) - age) for h, age in guessed]
    left = [0.0] * max(0, slots - len(left)) + left
    heapq.heapify(left)
    for _ in range(ahead):  # each waiter ahead takes the earliest and holds it
        heapq.heapreplace(left, left[0] + hold)
    return left


def newcomer_wait_ms(
    *,
    slots: int,
    running: int,
    ahead: int,
    frees_s: Sequence[float] | None,
    backlog_ms: float,
    busy_ms_per_seq: float | None,
) -> float | None:
    """The wait before a newcomer's own prefill (see the module docstring): with a
    slot free and nobody ahead, the backlog and the sequences beside it; else the
    larger of its slot's release (``frees_s[0]``, the earliest of
    :func:`slot_frees_s`) and the backlog, beside every other slot. ``None`` when it
    would queue and its slot's release is unknown."""
    busy = busy_ms_per_seq or 0.0
    if running < slots and ahead == 0:
        return backlog_ms + running * busy
    if not frees_s:
        return None
    return max(frees_s[0] * 1000.0, backlog_ms) + (slots - 1) * busy
