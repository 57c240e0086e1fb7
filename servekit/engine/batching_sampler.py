"""Per-sequence sampling for the batching engine: one llama.cpp sampler chain per slot.

Each running sequence owns a chain built from its own :class:`SamplingParams`,
so one batch can mix greedy and seeded-random sequences. Temperature 0 (or
``top_p`` 0) is plain argmax over the logits, the same choice the
single-sequence engine makes. Worker-thread only.
"""

from __future__ import annotations

import random
from typing import Any

import llama_cpp

from servekit.engine.protocol import SamplingParams

__all__ = ["SamplerChain"]

# How many recent tokens presence/frequency penalties look at (llama.cpp's default).
PENALTY_LAST_N = 64


class SamplerChain:
    """A llama.cpp sampler chain for one sequence; free it with :meth:`close`."""

    def __init__(self, params: SamplingParams, n_vocab: int) -> None:
        self._chain: Any = llama_cpp.llama_sampler_chain_init(
            llama_cpp.llama_sampler_chain_default_params()
        )
        add = llama_cpp.llama_sampler_chain_add
        if params.presence_penalty or params.frequency_penalty:
            add(
                self._chain,
                llama_cpp.llama_sampler_init_penalties(
                    n_vocab,
                    PENALTY_LAST_N,
                    1.0,
                    params.frequency_penalty,
                    params.presence_penalty,
                ),
            )
        if params.greedy:
            add(self._chain, llama_cpp.llama_sampler_init_greedy())
            return
        if params.top_p < 1.0:
            add(self._chain, llama_cpp.llama_sampler_init_top_p(params.top_p, 1))
        add(self._chain, llama_cpp.llama_sampler_init_temp(params.temperature))
        seed = params.seed if params.seed is not None else random.getrandbits(32)
        add(self._chain, llama_cpp.llama_sampler_init_dist(seed & 0xFFFFFFFF))

    def sample(self, ctx: Any, index: int) -> int:
        """Pick (and accept into the chain's history) the next token from batch item ``index``."""
        return int(llama_cpp.llama_sampler_sample(self._chain, ctx, index))

    def close(self) -> None:
        if self._chain is not None:
            llama_cpp.llama_sampler_free(self._chain)
            self._chain = None
