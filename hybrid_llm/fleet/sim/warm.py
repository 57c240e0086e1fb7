"""An instance's engine history at t=0: what its real engine reported before the run.

``warm:`` in the simulator's settings gives it per instance
(:class:`~hybrid_llm.fleet.sim.config.WarmState`: TTFT P50/P95 and how many
samples the engine's window held, rates, busy slowdown); by default the
profile's rates and no TTFT history. :func:`warm_stats` records that history
in the instance's :class:`~servekit.engine.batching_stats.BatchingStats`, so
its load reports carry it until its own measurements push it out.
"""

from __future__ import annotations

from hybrid_llm.fleet.sim.config import WarmState
from servekit.engine.batching_stats import RATE_WINDOW_S, BatchingStats

__all__ = ["warm_stats"]


def warm_stats(stats: BatchingStats, now: float, state: WarmState) -> None:
    """Record in ``stats`` the history ``state`` describes, as of ``now``.

    ``samples`` TTFTs with that P50 and P95: a tenth of them (at least as many
    as the engine's nearest-rank P95 needs) the P95, spread evenly so the tail
    leaves the window as slowly as the rest when new ones push old ones out;
    and one prefill and one decode step, a window ago, with those rates: they
    count until newer steps push them out of the rate window, as on the
    engine; its busy slowdown until the instance has measured its own.
    """
    ttft_p50_ms, ttft_p95_ms, samples = state.ttft_p50_ms, state.ttft_p95_ms, state.samples
    decode_tokens_per_s = state.decode_tokens_per_s
    prefill_tokens_per_s = state.prefill_tokens_per_s
    stats.assume_busy_ms_per_seq(state.busy_ms_per_seq)
    if ttft_p50_ms is not None and samples > 0:
        high = ttft_p95_ms if ttft_p95_ms is not None else ttft_p50_ms
        needed = samples - round(0.95 * (samples - 1))  # see servekit.engine.rates
        tail = max(needed, samples // 10)
        for i in range(samples):
            top = (i + 1) * tail // samples > i * tail // samples
            stats.record_ttft((high if top else ttft_p50_ms) / 1000.0)
    then = now - RATE_WINDOW_S / 2
    prefill_s = 0.0
    if prefill_tokens_per_s:
        prefill_s = 1000 / prefill_tokens_per_s
        stats.record_step(1, 0, 1000, prefill_s, now=then)
    if decode_tokens_per_s:
        # decode / (all busy seconds) is the reported rate, prefill steps included
        tokens = 1000
        seconds = max(1e-6, tokens / decode_tokens_per_s - prefill_s)
        tokens = max(1, round(decode_tokens_per_s * (seconds + prefill_s)))
        stats.record_step(1, tokens, 0, seconds, now=then)
