"""The batching engine's recent rates: a 10 s window of steps, kept as running sums."""

from __future__ import annotations

import pytest

from servekit.engine.batching import prefill_backlog_ms
from servekit.engine.batching_stats import RATE_WINDOW_S, BatchingStats


def test_rates_cover_only_the_last_window_of_steps() -> None:
    stats = BatchingStats(slots=4)
    # 20 s of slow steps, then 10 s of fast ones: only the fast ones are in the window.
    t = 0.0
    for i in range(200):
        stats.record_step(4, 4, 64 if i % 4 == 0 else 0, 0.5, now=t)
        t += 0.1
    t += 1.0  # a pause, so that no slow step sits on the window's edge
    for i in range(90):  # 8.9 s of fast steps: all inside the window
        stats.record_step(4, 4, 64 if i % 3 == 0 else 0, 0.02, now=t)
        t += 0.1
    snap = stats.snapshot()
    assert RATE_WINDOW_S > 90 * 0.1
    assert snap.decode_tokens_per_s == pytest.approx(4 * 90 / (0.02 * 90))
    # Prefill speed from the 30 prefilling steps alone.
    assert snap.prefill_tokens_per_s == pytest.approx(64 * 30 / (0.02 * 30))


def test_an_emptied_window_keeps_the_last_prefill_rate() -> None:
    """An idle engine still prices a burst's prompts: admission needs the rate at once."""
    stats = BatchingStats(slots=1)
    assert stats.snapshot().prefill_tokens_per_s is None  # never measured
    stats.record_step(1, 1, 32, 0.1, now=0.0)
    assert stats.snapshot().prefill_tokens_per_s == pytest.approx(320.0)
    stats.record_step(1, 0, 0, 0.0, now=RATE_WINDOW_S + 5)  # an empty step, long after
    snap = stats.snapshot()
    assert snap.decode_tokens_per_s is None
    assert snap.prefill_tokens_per_s == pytest.approx(320.0)
    # The next prefill in a fresh window replaces it.
    stats.record_step(1, 0, 64, 0.1, now=RATE_WINDOW_S + 6)
    assert stats.snapshot().prefill_tokens_per_s == pytest.approx(640.0)


def test_jobs_not_yet_taken_in_count_at_their_estimated_tokens() -> None:
    """A burst that lands while the worker is inside a step: each job is priced."""
    stats = BatchingStats(slots=4)
    stats.record_step(1, 0, 100, 1.0, now=0.0)  # 100 prompt tokens a second
    stats.prefill_backlog_tokens = 50  # a running sequence still prefilling
    snap = stats.snapshot()
    assert prefill_backlog_ms(snap, pending_tokens=0) == pytest.approx(500.0)
    # Jobs in the inbox estimated at 200 uncached tokens in all.
    assert prefill_backlog_ms(snap, pending_tokens=200) == pytest.approx(2500.0)
    idle = BatchingStats(slots=4).snapshot()
    assert prefill_backlog_ms(idle, pending_tokens=0) == 0.0
    assert prefill_backlog_ms(idle, pending_tokens=300) is None  # no rate to price them by
