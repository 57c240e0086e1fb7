"""Engine profile measurement against a server with known prefill and decode costs."""

from __future__ import annotations

import random
import time

import pytest

from hybrid_llm.bench.profile import fit_line, measure_profile
from hybrid_llm.local.servers import UvicornThread
from tests.hybrid_llm.fake_openai import Timing, create_app


def test_fit_line() -> None:
    a, b = fit_line([0, 1, 2, 3], [1, 3, 5, 7])
    assert a == pytest.approx(1)
    assert b == pytest.approx(2)


@pytest.mark.anyio
async def test_profile_recovers_known_prefill_rate_and_step_time() -> None:
    # 0.5 ms per prompt token = 2000 tokens/s; 20 ms fixed; 10 ms between tokens.
    timing = Timing(ttft=0.02, itl=0.01, prefill_s_per_token=0.0005)
    with UvicornThread(create_app(timing)) as srv:
        out = await measure_profile(
            srv.url, prompt_lengths=(16, 128, 256), repeats=2, decode_tokens=12
        )
    profile = out["profile"]
    assert profile.slots == 4  # from /load
    assert 1500 <= profile.prefill_tokens_per_s <= 2300
    assert 15 <= profile.overhead_ms <= 45
    assert set(out["step_s_by_batch"]) == {1, 2, 4}
    assert 9 <= profile.decode_base_ms <= 16
    # The double's step does not grow with the batch.
    assert profile.decode_per_seq_ms < 2


@pytest.mark.anyio
async def test_profile_idles_before_each_prefill_request() -> None:
    # gap_s: an exponential pause before each prefill request (seeded), so the
    # engine is measured in the state traffic at 1/gap_s per second finds it.
    timing = Timing(ttft=0.005, itl=0.002)
    rng = random.Random(3)
    pauses = sum(rng.expovariate(1 / 0.1) for _ in range(4))
    with UvicornThread(create_app(timing)) as srv:
        t0 = time.perf_counter()
        await measure_profile(
            srv.url, prompt_lengths=(8, 32), repeats=2, batches=[1], decode_tokens=3
        )
        fast = time.perf_counter() - t0
        t0 = time.perf_counter()
        out = await measure_profile(
            srv.url,
            prompt_lengths=(8, 32),
            repeats=2,
            batches=[1],
            decode_tokens=3,
            gap_s=0.1,
            seed=3,
        )
        slow = time.perf_counter() - t0
    assert slow >= pauses
    assert slow - fast >= pauses * 0.9
    assert len(out["ttft_points"]) == 4


@pytest.mark.anyio
async def test_profile_measures_mixed_steps_and_dispersion() -> None:
    # Each stream in flight when a request arrives adds 40 ms to its first token.
    timing = Timing(ttft=0.03, itl=0.01, per_stream_s=0.04)
    with UvicornThread(create_app(timing)) as srv:
        out = await measure_profile(
            srv.url,
            prompt_lengths=(8, 32),
            repeats=4,
            batches=[1, 2],
            decode_tokens=12,
            mixed_prompt=8,
            mixed_repeats=2,
        )
    profile = out["profile"]
    # Riders 1 to slots - 1 (the double reports 4 slots), each probe behind k streams.
    assert [k for k, _ in profile.mixed_points] == [1, 2, 3]
    for k, extra in profile.mixed_points:
        assert 0.04 * k - 0.01 <= extra <= 0.04 * k + 0.03
    # The dispersion of what was measured: quantiles of value / median, ends included.
    assert profile.prefill_spread[0][0] == 0.0
    assert profile.prefill_spread[-1][0] == 1.0
    assert dict(profile.prefill_spread)[0.5] == pytest.approx(1.0)
    assert set(profile.step_spread) == {1, 2}
    low, high = profile.step_spread[1][0][1], profile.step_spread[1][-1][1]
    assert low <= 1.0 <= high
    # The simulator uses the measured mixed cost, not the per-sequence decode cost.
    assert profile.mixed_extra_s(2) == pytest.approx(profile.mixed_points[1][1])


@pytest.mark.anyio
async def test_profile_skips_mixed_steps_when_asked() -> None:
    timing = Timing(ttft=0.005, itl=0.002)
    with UvicornThread(create_app(timing)) as srv:
        out = await measure_profile(
            srv.url,
            prompt_lengths=(8, 32),
            repeats=2,
            batches=[1],
            decode_tokens=3,
            mixed_riders=(),
        )
    assert out["profile"].mixed_points == []
    assert out["mixed_extra_s"] == {}
