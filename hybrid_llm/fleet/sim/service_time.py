"""How long a simulated instance's work takes (:mod:`hybrid_llm.fleet.sim.instance`).

A new sequence copies the shared prompt prefix (the chat template's preamble)
from another slot, so only the rest counts as prefilled tokens
(:func:`uncached_tokens`); further cached tokens (a system prompt, earlier
turns) come off the profile's measured prefill time (:func:`prefill_s`).

A prefill with decoders riding along costs what the profile measured such
mixed steps to cost (``EngineProfile.mixed_points``, less the half decode
step a probe waited for when the prefill starts at a step boundary; without
them, the per-sequence decode cost of each rider): :func:`riders_s`.

A decode step's median time grows with the batch, and a stretch of steps
runs at a ratio drawn from the profile's ``step_spread`` at that batch size
(:class:`DecodeSteps`).
"""

from __future__ import annotations

import math
import random
from typing import TYPE_CHECKING

from hybrid_llm.fleet.sim.profiles import EngineProfile
from hybrid_llm.fleet.sim.spread import SpreadSampler

if TYPE_CHECKING:
    from hybrid_llm.fleet.sim.request import Job

__all__ = ["DecodeSteps", "prefill_s", "prefill_steps", "riders_s", "uncached_tokens"]


def uncached_tokens(job: Job) -> int:
    """Prompt tokens the engine computes (the last one always is)."""
    prompt = job.req.prompt_tokens
    return max(1, prompt - min(job.cached, prompt - 1))


def prefill_s(profile: EngineProfile, job: Job) -> float:
    """The idle prefill of ``req``'s uncached tokens. A measured time at a prompt
    length already holds what copying the profile's shared preamble saves; each
    further cached token (a system prompt, earlier turns) takes off what the
    profile says computing the prompt up to there costs. On an engine whose cost
    per token grows with the context, the tokens after a long cached prefix cost
    more than as many at the start of a prompt: T(P) - T(C) + T(preamble) (a
    request that found less than the preamble cached computes that much more)."""
    req = job.req
    prompt = req.prompt_tokens
    cached = min(job.cached, prompt - 1)
    preamble = req.preamble_tokens
    if preamble is None:
        preamble = req.cached_tokens - req.history_tokens
    if cached == preamble:
        return profile.prefill_s(prompt)
    held = profile.prefill_s(cached) - profile.prefill_s(preamble)
    return max(0.0, profile.prefill_s(prompt) - held)


def prefill_steps(job: Job, chunk_tokens: int | None) -> int:
    """Engine steps ``job``'s prefill takes: one, or one per ``chunk_tokens`` uncached."""
    return 1 if chunk_tokens is None else math.ceil(uncached_tokens(job) / chunk_tokens)


def riders_s(
    profile: EngineProfile, decoders: int, decode_step_s: float, steps: int, boundary: bool
) -> float:
    """What ``decoders`` riding along add to a prefill of ``steps`` steps: what the profile
    measured mixed steps to add per prefill step (else each decoder's step cost).
    A measured figure includes the probe's wait for the decode step in flight
    (``decode_step_s``) when it arrived (half a step on average): a prefill that
    starts at a step boundary (``boundary``: after a completion or another prefill,
    as a queued request does on a busy engine) does not wait, so that half step
    comes off; one arriving while the decoders run waits it once."""
    if decoders == 0:
        return 0.0
    extra = profile.mixed_extra_s(decoders)
    if not profile.mixed_points:
        return extra * steps
    wait = decode_step_s / 2
    return max(0.0, extra - wait) * steps + (0.0 if boundary else wait)


class DecodeSteps:
    """One instance's decode step times: the median at a batch size, and the
    ratio a stretch of steps draws around it from the instance's seeded RNG."""

    def __init__(self, profile: EngineProfile, rng: random.Random) -> None:
        # Hot-path copies of the profile (pydantic attribute access is slow).
        self._base = profile.decode_base_ms / 1000.0
        self._per = profile.decode_per_seq_ms / 1000.0
        self._profile = profile
        self._rng = rng
        self._spreads: dict[int, SpreadSampler] = {}

    def median_s(self, batch: int) -> float:
        """Seconds per decode step with ``batch`` sequences running."""
        return self._base + self._per * (batch - 1 if batch > 1 else 0)

    def factor(self, batch: int, steps: float) -> float:
        """The mean step-time ratio of the next ``steps`` decode steps, each drawn
        from the profile's spread at this batch size (1 without one)."""
        sampler = self._spreads.get(batch)
        if sampler is None:
            spread = self._profile.step_spread_for(batch)
            sampler = self._spreads[batch] = SpreadSampler(spread, self._rng)
        return sampler.draw_mean(math.ceil(steps)) if sampler.active else 1.0
