"""How late an instance's TTFT predictions ran: the margin of a budget met at a
quantile (``admission.ttft_budget_quantile``, :mod:`servekit.admission`).

Admission predicts a typical TTFT: its wait and its own prefill. The budget is
what admitted requests should meet. Under a 32-stream overload of the CPU
edges their predictions were right on the median (34 ms early) but 430 ms
late at the 90th percentile and 750 ms at the 99th: a newcomer that queued
for a slot is placed at the next step boundary, waits for the step in flight
and shares its own step with the other newcomers placed with it, which its
price cannot know when it queues. Judged on the prediction alone, 1 in 10
admitted requests was past the 1.5 s budget and the slowest past 2 s.

So the queue also learns how late it was: for each admitted request, its
first token's time from arrival less the TTFT it was predicted (prompts the
idle rule took at a share of their prefill are left out), the last
:data:`LATE_WINDOW` of them. Their quantile (never below 0) is a margin the
prediction of a newcomer that would queue carries against the budget; until
:data:`LATE_MIN` were seen, such a newcomer is refused (the opening burst of
an overload queued behind predictions with no margin yet and was the slowest
of its runs, 2.0-3.1 s). A newcomer that finds a slot free is judged on its
prediction alone: charged to every newcomer, a margin priced on its first
four samples (up to 1 s) refused even those, the edge emptied, and idle it
took the idle rule's 480-713-token prompts (4.4-5.7 s to their first tokens,
the slowest of two runs). With the margin the edges admitted as many
requests as before, with a lower median TTFT: it shortens the queue, not the
throughput, since a slot that frees is taken by the next arrival.
"""

from __future__ import annotations

from collections import deque

__all__ = ["LATE_MIN", "LATE_WINDOW", "Lateness"]

LATE_WINDOW = 128  # recent admitted requests whose lateness prices the margin
LATE_MIN = 8  # of them seen before there is a margin (and before anyone may queue)


class Lateness:
    """Recent admitted requests' lateness, and its quantile (``None``: not wanted)."""

    def __init__(self, quantile: float | None) -> None:
        self.quantile = quantile
        self._late: deque[float] = deque(maxlen=LATE_WINDOW)  # ms later than predicted
        self._margin = 0.0  # priced as samples arrive: admission asks per request

    def record(self, predicted_ms: float | None, ttft_ms: float) -> None:
        """A first token ``ttft_ms`` after its request arrived, predicted at
        ``predicted_ms`` (``None``: not judged whole, nothing to learn)."""
        q = self.quantile
        if predicted_ms is None or q is None:
            return
        self._late.append(ttft_ms - predicted_ms)
        if len(self._late) >= LATE_MIN:
            ordered = sorted(self._late)
            self._margin = max(0.0, ordered[min(len(ordered) - 1, int(q * len(ordered)))])

    @property
    def unknown(self) -> bool:
        """A margin is wanted and too few first tokens were seen to price it."""
        return self.quantile is not None and len(self._late) < LATE_MIN

    def margin_ms(self) -> float:
        """The quantile of the recent lateness (never below 0); 0 when not wanted or
        still unknown."""
        return self._margin
