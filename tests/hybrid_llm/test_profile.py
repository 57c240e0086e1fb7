"""Engine profile measurement against a server with known prefill and decode costs."""

from __future__ import annotations

import random
import time

import pytest

from hybrid_llm.profile import fit_line, measure_profile
from tests.hybrid_llm.fake_openai import Timing, create_app
from tests.support.servers import UvicornThread


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
