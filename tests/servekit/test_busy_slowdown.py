"""The busy slowdown per running sequence, as BatchingStats measures it from admissions."""

from __future__ import annotations

import random

import pytest

from servekit.engine.batching_stats import BatchingStats
from servekit.engine.busy_slowdown import ReferenceCurve


def idle_ttft(tokens: int) -> float:
    """An engine's idle TTFT: fixed cost plus a per-token cost that grows with context."""
    return 0.015 + 0.002 * tokens + 2e-6 * tokens * tokens


def admit(
    stats: BatchingStats,
    rng: random.Random,
    n: int,
    running: int,
    per_seq_s: float,
    lengths: tuple[int, ...] = (10, 60, 200, 700),
) -> None:
    for _ in range(n):
        tokens = rng.choice(lengths)
        seconds = idle_ttft(tokens) * rng.uniform(0.97, 1.03) + running * per_seq_s
        stats.record_ttft(seconds, running=running, prefilled=tokens)


def test_mixed_prompt_lengths_without_slowdown_measure_about_zero() -> None:
    # Long and short prompts spread the TTFTs by over a second; running sequences
    # that cost a newcomer nothing must not show up as a busy slowdown.
    stats, rng = BatchingStats(slots=4), random.Random(1)
    admit(stats, rng, 40, running=0, per_seq_s=0.0)
    for running in (1, 2, 3):
        admit(stats, rng, 40, running=running, per_seq_s=0.0)
    snap = stats.snapshot()
    assert snap.ttft_p95_ms is not None
    assert snap.ttft_p50_ms is not None
    assert snap.ttft_p95_ms - snap.ttft_p50_ms > 1000  # the old penalty's figure
    assert snap.busy_ms_per_seq == pytest.approx(0.0, abs=2.0)


@pytest.mark.parametrize("per_seq_ms", [5.0, 30.0, 120.0])
def test_arrivals_at_a_busy_engine_measure_the_injected_slowdown(per_seq_ms: float) -> None:
    stats, rng = BatchingStats(slots=4), random.Random(2)
    admit(stats, rng, 40, running=0, per_seq_s=0.0)
    for running in (1, 2, 3):
        admit(stats, rng, 40, running=running, per_seq_s=per_seq_ms / 1000)
    got = stats.snapshot().busy_ms_per_seq
    assert got == pytest.approx(per_seq_ms, abs=0.1 * per_seq_ms + 2.0)


def test_an_engine_never_idle_measures_against_its_least_busy_admissions() -> None:
    stats, rng = BatchingStats(slots=16), random.Random(5)
    for _ in range(30):
        for running in range(3, 12):
            admit(stats, rng, 1, running=running, per_seq_s=0.004)
    assert stats.snapshot().busy_ms_per_seq == pytest.approx(4.0, abs=1.0)


def test_a_few_stalled_admissions_do_not_set_the_price() -> None:
    stats, rng = BatchingStats(slots=4), random.Random(3)
    admit(stats, rng, 20, running=0, per_seq_s=0.0)
    admit(stats, rng, 40, running=2, per_seq_s=0.030)
    for _ in range(8):  # stalled behind a long prompt: a second more
        stats.record_ttft(idle_ttft(60) + 1.0, running=2, prefilled=60)
    assert stats.snapshot().busy_ms_per_seq == pytest.approx(30.0, abs=5.0)


def test_nothing_is_reported_until_measured_and_never_below_zero() -> None:
    stats, rng = BatchingStats(slots=4), random.Random(4)
    admit(stats, rng, 20, running=1, per_seq_s=0.030, lengths=(60,))
    assert stats.snapshot().busy_ms_per_seq is None  # no idle admissions to compare with
    stats.record_ttft(0.2)  # a TTFT without admission details (warm history) is no sample
    admit(stats, rng, 3, running=0, per_seq_s=0.0, lengths=(60,))
    assert stats.snapshot().busy_ms_per_seq is None  # the same running count everywhere
    admit(stats, rng, 1, running=0, per_seq_s=0.0, lengths=(60,))
    assert stats.snapshot().busy_ms_per_seq == pytest.approx(30.0, abs=5.0)
    faster = BatchingStats(slots=4)
    admit(faster, rng, 10, running=0, per_seq_s=0.0)
    admit(faster, rng, 20, running=1, per_seq_s=-0.010)
    assert faster.snapshot().busy_ms_per_seq == 0.0


def test_the_sample_counts_from_arrival_when_given_and_a_prior_holds_until_measured() -> None:
    stats = BatchingStats(slots=4)
    stats.assume_busy_ms_per_seq(80.0)
    for _ in range(4):
        stats.record_ttft(0.100, running=0, prefilled=50)
    for _ in range(8):
        assert stats.snapshot().busy_ms_per_seq == pytest.approx(80.0)
        # From its slot 100 ms, as idle; 25 ms more from its arrival (the step in flight).
        stats.record_ttft(0.100, running=1, prefilled=50, from_arrival=0.125)
    snap = stats.snapshot()
    assert snap.busy_ms_per_seq == pytest.approx(25.0)
    assert snap.ttft_p50_ms == pytest.approx(100.0)  # the reported TTFT stays slot-to-token


def test_reference_curve_interpolates_measured_points_and_extends_the_ends() -> None:
    curve = ReferenceCurve([(n, idle_ttft(n)) for n in (10, 60, 200, 700) for _ in range(5)])
    for n in (10, 60, 200, 700):
        assert curve.at(n) == pytest.approx(idle_ttft(n))
    assert idle_ttft(60) < curve.at(130) < idle_ttft(200)
    slope = (idle_ttft(700) - idle_ttft(200)) / 500
    assert curve.at(900) == pytest.approx(idle_ttft(700) + 200 * slope)
    single = ReferenceCurve([(20, 0.1), (20, 0.1), (20, 0.1)])
    assert (single.at(20), single.at(40)) == (pytest.approx(0.1), pytest.approx(0.2))
