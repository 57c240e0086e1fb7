"""The batching engine's busy slowdown: what it reports against what a client sees.

    .venv/bin/python -m studies.busy_slowdown [--model models/...gguf] [--per-level 16]

Loads the batching engine in-process with ``configs/edge-local.yaml``'s
engine settings (4 slots, 128-token chunks, 2 threads) and sends probe
requests of mixed prompt lengths (unique random words, so nothing but the chat
template's preamble is in a slot's cache), ``max_tokens=1``, one at a time:

1. idle: nothing else runs;
2. busy: k = 1, 2, 3 background workers keep a sequence each decoding (a long
   answer; when one ends, the worker starts the next).

The client measures each probe's TTFT (submit to first event) and reads the
engine's ``running`` just before it. Per probe, the *direct* slowdown per
running sequence is ``(TTFT - idle median TTFT at that length) / running``;
the script prints its median per k beside what the engine reports in its load
report (``busy_ms_per_seq``, fitted from all its admissions, background ones
included) and beside the old router penalty, the engine's TTFT P95 - P50.
One run, figures printed; nothing asserted.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import statistics
import time
from pathlib import Path

from servekit.engine.batching import BatchingLlamaEngine, BatchingSettings
from servekit.engine.protocol import GenerationRequest, Message, SamplingParams

ROOT = Path(__file__).resolve().parents[1]
WORDS = ["river", "stone", "cloud", "paper", "garden", "window", "silver", "market"]
LENGTHS = (4, 20, 50, 100)  # words of a probe's user message
STORY = "Write a long story about a lighthouse keeper, chapter by chapter."


def probe(words: int, rng: random.Random) -> GenerationRequest:
    text = " ".join(f"{rng.choice(WORDS)}{rng.randrange(100)}" for _ in range(words))
    params = SamplingParams(max_tokens=1, temperature=0.0)
    return GenerationRequest("bench", params, messages=(Message("user", text),))


async def ttft(engine: BatchingLlamaEngine, req: GenerationRequest) -> float:
    start = time.perf_counter()
    async for _ in engine.generate(req):
        return time.perf_counter() - start
    raise RuntimeError("no event")


async def keep_decoding(engine: BatchingLlamaEngine, seed: int) -> None:
    while True:
        params = SamplingParams(max_tokens=1500, temperature=1.0, seed=seed)
        req = GenerationRequest("bench", params, messages=(Message("user", STORY),))
        async for _ in engine.generate(req):
            pass
        seed += 1


async def probes(
    engine: BatchingLlamaEngine, rng: random.Random, count: int
) -> list[tuple[int, int, float]]:
    """(words, engine running before, TTFT seconds) of ``count`` probes."""
    out = []
    for i in range(count):
        words = LENGTHS[i % len(LENGTHS)]
        running = engine.load().running
        out.append((words, running, await ttft(engine, probe(words, rng))))
        await asyncio.sleep(0.05)
    return out


async def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument(
        "--model", type=Path, default=ROOT / "models/SmolLM2-135M-Instruct.Q4_1.gguf"
    )
    parser.add_argument("--per-level", type=int, default=16, help="probes per busy level")
    args = parser.parse_args()
    settings = BatchingSettings(
        model_path=args.model,
        model_name="smollm2",
        slots=4,
        ctx_per_slot=2048,
        chunk_tokens=128,
        n_threads=2,
    )
    engine = BatchingLlamaEngine(settings)
    await engine.start()
    rng = random.Random(1)
    try:
        idle: dict[int, list[float]] = {n: [] for n in LENGTHS}
        for words, _, t in await probes(engine, rng, args.per_level * 2):
            idle[words].append(t)
        base = {n: statistics.median(v) for n, v in idle.items()}
        print("idle TTFT median ms by words:", {n: round(t * 1000, 1) for n, t in base.items()})
        load = engine.load()
        spread = (load.ttft_p95_ms or 0) - (load.ttft_p50_ms or 0)
        print(f"idle: engine busy_ms_per_seq {load.busy_ms_per_seq}; P95-P50 {spread:.1f} ms")
        for k in (1, 2, 3):
            workers = [asyncio.create_task(keep_decoding(engine, 100 * k + i)) for i in range(k)]
            await asyncio.sleep(1.0)  # past their prefill, decoding
            busy = await probes(engine, rng, args.per_level)
            for w in workers:
                w.cancel()
            await asyncio.gather(*workers, return_exceptions=True)
            await asyncio.sleep(0.3)
            per_seq = [(t - base[n]) / r * 1000 for n, r, t in busy if r]
            load = engine.load()
            spread = (load.ttft_p95_ms or 0) - (load.ttft_p50_ms or 0)
            reported = load.busy_ms_per_seq
            print(
                f"k={k}: running at probes {sorted({r for _, r, _ in busy})}; direct ms per "
                f"running sequence median {statistics.median(per_seq):.1f} "
                f"(mean {statistics.mean(per_seq):.1f}); engine busy_ms_per_seq "
                f"{reported and round(reported, 1)}; old penalty P95-P50 {spread:.1f} ms"
            )
    finally:
        await engine.aclose()
    print(f"loadavg {os.getloadavg()}")


if __name__ == "__main__":
    asyncio.run(main())
