"""Engine performance profiles: what one engine instance costs per request.

A profile is three numbers and a slot count: prefill throughput, and a decode
step time that grows linearly with the batch (``step_ms = base + per_seq * b``),
the memory-bound shape of transformer decode (every step streams all weights;
each extra sequence adds its KV-cache reads). A measured profile
(``hybrid-llm profile``) adds what the real engine showed: TTFT by prompt
length, what decoders riding along add to a prefill step (mixed steps), and
how much prefill and decode step times vary (quantiles the simulator draws
from). The presets derive those numbers
from published hardware figures; the assumptions are in each docstring entry
and in ``docs/operations.md``. Replace them with measurements
(``hybrid-llm profile``) when you have the hardware.
"""

from __future__ import annotations

import bisect
import math

from pydantic import BaseModel, Field, field_validator

from hybrid_llm.fleet.sim.spread import Spread

__all__ = ["PRESETS", "EngineProfile"]


class EngineProfile(BaseModel):
    """Cost model of one engine instance (one edge node, or one center replica)."""

    name: str = "custom"
    prefill_tokens_per_s: float = Field(gt=0, description="prompt tokens processed per second")
    decode_base_ms: float = Field(gt=0, description="decode step time at batch size 1")
    decode_per_seq_ms: float = Field(0.0, ge=0, description="added step time per extra sequence")
    slots: int = Field(1, ge=1, description="sequences decoded together (max batch)")
    queue_limit: int = Field(64, ge=0, description="waiting requests before it answers 429")
    gpus: int = Field(1, ge=0, description="GPUs one instance occupies (0 for CPU)")
    gpu_kind: str = Field(
        "", description="GPU model, the key of its price in `gpu_hour_usd` (empty: no GPU)"
    )
    overhead_ms: float = Field(0.0, ge=0, description="fixed per-request cost (HTTP, tokenize)")
    chunk_tokens: int | None = Field(
        None,
        ge=1,
        description="prompt tokens per batched step (chunked prefill, each step also carries "
        "one token of every decoding sequence); None: a prompt prefills in one step",
    )
    prefill_points: list[tuple[int, float]] = Field(
        default_factory=list,
        description="measured (prompt tokens, seconds to first token); when given, prefill "
        "time is interpolated from them instead of the rate (engines are not linear)",
    )

    mixed_points: list[tuple[int, float]] = Field(
        default_factory=list,
        description="measured (decoding sequences, seconds): what a prefill step takes longer "
        "when that many sequences decode along (their tokens ride in it), beyond the idle "
        "prefill; interpolated, through (0, 0); none: decode_per_seq_ms per decoder",
    )
    prefill_spread: Spread = Field(
        default_factory=list,
        description="quantiles (q, measured / median) of prefill times: each simulated "
        "prefill is scaled by a ratio drawn from them; none: no variance",
    )
    step_spread: dict[int, Spread] = Field(
        default_factory=dict,
        description="batch size -> quantiles (q, measured / median) of its decode step "
        "times; the simulator draws step times from the nearest batch size's",
    )

    @field_validator("prefill_points", "mixed_points")
    @classmethod
    def _sorted(cls, points: list[tuple[int, float]]) -> list[tuple[int, float]]:
        return sorted(points)

    def mixed_extra_s(self, decoders: int) -> float:
        """Seconds ``decoders`` riding sequences add to one prefill step."""
        if decoders <= 0:
            return 0.0
        points = self.mixed_points
        if not points:
            return self.decode_per_seq_ms / 1000.0 * decoders
        # Piecewise linear through (0, 0) and the measured points, the last slope beyond.
        xs = [(0, 0.0), *points] if points[0][0] > 0 else points
        if len(xs) < 2:
            return xs[0][1]
        i = bisect.bisect_left(xs, (decoders, -math.inf))
        i = min(max(i, 1), len(xs) - 1)
        (x0, y0), (x1, y1) = xs[i - 1], xs[i]
        slope = (y1 - y0) / (x1 - x0) if x1 != x0 else 0.0
        return y0 + slope * (decoders - x0)

    def step_spread_for(self, batch: int) -> Spread:
        """The decode step spread measured at the batch size nearest ``batch``."""
        if not self.step_spread:
            return []
        nearest = min(self.step_spread, key=lambda b: (abs(b - batch), b))
        return self.step_spread[nearest]

    def step_s(self, batch: int) -> float:
        """Seconds per decode step with ``batch`` sequences running."""
        return (self.decode_base_ms + self.decode_per_seq_ms * max(0, batch - 1)) / 1000.0

    def prefill_s(self, prompt_tokens: int) -> float:
        points = self.prefill_points
        if len(points) < 2:
            return self.overhead_ms / 1000.0 + prompt_tokens / self.prefill_tokens_per_s
        # Piecewise linear through the measured points, the end slopes beyond them.
        i = bisect.bisect_left(points, (prompt_tokens, -1.0))
        i = min(max(i, 1), len(points) - 1)
        (x0, y0), (x1, y1) = points[i - 1], points[i]
        slope = (y1 - y0) / (x1 - x0) if x1 != x0 else 0.0
        return max(0.0, y0 + slope * (prompt_tokens - x0))


# Sources and arithmetic (public spec sheets; efficiencies are assumptions):
# - H100 SXM: 3.35 TB/s HBM3, ~1979 TFLOPS dense FP8 (NVIDIA H100 datasheet).
#   Llama-3.1-70B in FP8 is ~70 GB of weights; on TP=4 the aggregate 13.4 TB/s
#   at ~60% achieved bandwidth gives ~9 ms per decode step; KV (FP8, GQA 8 heads,
#   80 layers, ~164 KB/token) at ~1k context adds ~0.05 ms per sequence; prefill
#   at ~2*70e9 FLOP/token and ~35% MFU of 4 GPUs is ~20k tokens/s. These agree
#   with vLLM's published 70B-on-4xH100 serving runs (ITL 10-25 ms at batch 1-64).
# - L4: 300 GB/s GDDR6, ~121 TFLOPS dense FP16 (NVIDIA L4 datasheet). An 8B model
#   in AWQ int4 is ~5 GB; at ~80% bandwidth a step is ~20 ms; KV (FP16, GQA,
#   32 layers, ~128 KB/token) at ~1k context adds ~0.5 ms per sequence; prefill
#   (AWQ kernels dequantise to FP16) at ~2*8e9 FLOP/token and ~50% MFU is ~4000
#   tokens/s.
# - CPU stand-in: SmolLM2-135M Q4_1 through llama.cpp on this project's 2-core
#   test machine, single sequence (measured; re-measure with `hybrid-llm profile`).
PRESETS: dict[str, EngineProfile] = {
    "h100x4-llama70b-fp8": EngineProfile(
        name="h100x4-llama70b-fp8",
        prefill_tokens_per_s=20_000,
        decode_base_ms=9.0,
        decode_per_seq_ms=0.05,
        slots=128,
        queue_limit=512,
        gpus=4,
        gpu_kind="H100",
        overhead_ms=3.0,
    ),
    "l4-llama8b-awq": EngineProfile(
        name="l4-llama8b-awq",
        prefill_tokens_per_s=4_000,
        decode_base_ms=20.0,
        decode_per_seq_ms=0.5,
        slots=16,
        queue_limit=32,
        gpus=1,
        gpu_kind="L4",
        overhead_ms=2.0,
    ),
    "cpu-smollm2-135m": EngineProfile(
        name="cpu-smollm2-135m",
        prefill_tokens_per_s=1_500,
        decode_base_ms=15.0,
        decode_per_seq_ms=0.0,
        slots=1,
        queue_limit=16,
        gpus=0,
        overhead_ms=2.0,
    ),
}
