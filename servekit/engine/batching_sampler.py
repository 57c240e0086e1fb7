"""Per-sequence sampling for the batching engine: one llama.cpp sampler chain per slot.

Each running sequence owns a chain built from its own :class:`SamplingParams`,
so one batch can mix greedy and seeded-random sequences. Temperature 0 (or
``top_p`` 0) is plain argmax over the logits, the same choice the
single-sequence engine makes. Worker-thread only.
"""

from __future__ import annotations

import random
from typing import Any

import numpy as np

from servekit.engine.llama_lib import llama_cpp
from servekit.engine.protocol import SamplingParams

__all__ = ["SamplerChain"]

# How many recent tokens presence/frequency penalties look at (as ``Llama``'s default).
PENALTY_LAST_N = 64


class SamplerChain:
    """A llama.cpp sampler chain for one sequence; free it with :meth:`close`.

    The chain is the one llama-cpp-python's ``Llama.generate`` builds for the
    single-sequence engine's arguments (penalties, then greedy, or the no-op
    top-k/typical/min-p stages around top-p, temperature and a seeded draw),
    so a seeded request samples the same tokens in both engines.
    """

    def __init__(self, params: SamplingParams, n_vocab: int, seed: int | None = None) -> None:
        self._n_vocab = n_vocab
        # Plain greedy needs no chain: argmax straight off the logits row is the same
        # choice (the first of equal maxima, as llama.cpp's greedy sampler) without
        # copying the whole vocabulary into a candidate array for every token.
        self._argmax = params.greedy and not (params.frequency_penalty or params.presence_penalty)
        self._chain: Any = llama_cpp.llama_sampler_chain_init(
            llama_cpp.llama_sampler_chain_default_params()
        )
        stages = [
            llama_cpp.llama_sampler_init_penalties(
                n_vocab, PENALTY_LAST_N, 1.0, params.frequency_penalty, params.presence_penalty
            )
        ]
        if params.greedy:
            stages.append(llama_cpp.llama_sampler_init_greedy())
        else:
            if params.seed is not None:
                seed = params.seed
            if seed is None:
                seed = random.getrandbits(32)
            stages += [
                llama_cpp.llama_sampler_init_top_k(0),
                llama_cpp.llama_sampler_init_typical(1.0, 1),
                llama_cpp.llama_sampler_init_top_p(params.top_p, 1),
                llama_cpp.llama_sampler_init_min_p(0.0, 1),
                llama_cpp.llama_sampler_init_temp(params.temperature),
                llama_cpp.llama_sampler_init_dist(seed & 0xFFFFFFFF),
            ]
        for stage in stages:
            llama_cpp.llama_sampler_chain_add(self._chain, stage)

    def sample(self, ctx: Any, index: int) -> int:
        """Pick (and accept into the chain's history) the next token from batch item ``index``."""
        if self._argmax:
            row = llama_cpp.llama_get_logits_ith(ctx, index)
            return int(np.ctypeslib.as_array(row, shape=(self._n_vocab,)).argmax())
        return int(llama_cpp.llama_sampler_sample(self._chain, ctx, index))

    def close(self) -> None:
        if self._chain is not None:
            llama_cpp.llama_sampler_free(self._chain)
            self._chain = None
