"""Continuous batching vs. the single-sequence engine, on the real model, in one run.

Prints:
- the machine's limit: ``llama_decode`` of 1 token (one sequence) vs. one
  8-token batch (8 sequences), medians of interleaved repetitions on a separate
  context ("probe", measured first and again around every row), and the median
  of the batching engine's own full 8-sequence decode steps in the same run
  ("in-run"); the limit is the 8-token batch's tokens/s. On a CPU shared with
  other work the in-run figure is the fair one: same minutes, same contention;
- for 1, 4 and 8 concurrent streams (closed loop: each stream sends its next
  request when the previous one finishes) and each engine: aggregate decode
  tokens/s, TTFT p50/p99, and for the batching engine its mean batch size;
- for the batching engine, the share of wall time spent inside llama_decode
  (the rest is the scheduler's own overhead: sampling, bookkeeping, hand-off);
- the two targets: batching's aggregate decode at 8 streams against the limit
  (>= 0.85x), and P99 TTFT at 8 streams against the single-sequence engine.

Aggregate decode tokens/s = completion tokens after each request's first token,
divided by the time during which at least one request was past its first token
and not finished (for the single-sequence engine that excludes the prefill of
queued requests; for the batching engine it includes prefill chunks that ride
along in decode steps).

Usage: .venv/bin/python bench/batching.py [--model PATH] [--tokens 64] [--rounds 2]
The CPU may be shared: run it more than once and compare.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import time
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from servekit.engine.batching import BatchingLlamaEngine, BatchingSettings  # noqa: E402
from servekit.engine.batching_llama import BatchItem, LlamaBatchModel  # noqa: E402
from servekit.engine.llama import LlamaCppEngine, LlamaSettings  # noqa: E402
from servekit.engine.protocol import (  # noqa: E402
    Engine,
    Finish,
    GenerationRequest,
    Message,
    SamplingParams,
    TextDelta,
)

THREADS = 2
STREAMS = (1, 4, 8)
CTX = 1024
PROBE_POSITION = 72
TOPICS = [
    "a lighthouse keeper", "a lost dog", "a city on Mars", "an old clock", "a dragon",
    "a rainy night", "a chess master", "a river", "a baker", "a robot gardener",
    "a mountain village", "a pirate ship", "a violin", "a desert storm", "a secret library",
    "a winter forest",
]  # fmt: skip


@dataclass
class Sample:
    submitted: float
    first: float
    finished: float
    tokens: int


class LimitProbe:
    """A second context on the same model, for timing raw llama_decode calls.

    Laid out like the benchmarked engine (8 slots of CTX tokens) and with its
    sequences at the context length the benchmark's streams are at on average
    (a ~40-token prompt plus half of 64 generated tokens), so that attention
    costs the same as in the engine's steps.
    """

    def __init__(self, model_path: Path, chunk: int, position: int = PROBE_POSITION) -> None:
        self.model = LlamaBatchModel(
            model_path, n_slots=8, ctx_per_slot=CTX, n_batch=8 + chunk, n_threads=THREADS
        )
        self.position = position
        prompt = [1000 + i % 500 for i in range(position)]
        for seq in range(8):
            self.model.decode([BatchItem(t, i, seq, False) for i, t in enumerate(prompt)])

    def measure(self, reps: int = 30) -> tuple[float, float]:
        """Median seconds of llama_decode for 1 token and for an 8-sequence batch."""
        one: list[float] = []
        eight: list[float] = []
        pos = self.position
        for r in range(reps):  # interleaved, so both see the same machine
            t = time.perf_counter()
            self.model.decode([BatchItem(2000, pos, 0, True)])
            one.append(time.perf_counter() - t)
            t = time.perf_counter()
            self.model.decode([BatchItem(2000 + r, pos + (s == 0), s, True) for s in range(8)])
            eight.append(time.perf_counter() - t)
            for seq in range(8):
                self.model.forget(seq, pos)
        return statistics.median(one), statistics.median(eight)


async def one_request(engine: Engine, text: str, tokens: int) -> Sample:
    req = GenerationRequest(
        "bench",
        SamplingParams(max_tokens=tokens, temperature=0.0),
        messages=(Message("user", text),),
    )
    submitted = time.perf_counter()
    first = 0.0
    count = 0
    async for ev in engine.generate(req):
        if isinstance(ev, TextDelta) and not first:
            first = time.perf_counter()
        if isinstance(ev, Finish):
            count = ev.completion_tokens
    return Sample(submitted, first or time.perf_counter(), time.perf_counter(), count)


async def load_test(engine: Engine, streams: int, rounds: int, tokens: int) -> list[Sample]:
    async def client(c: int) -> list[Sample]:
        out = []
        for r in range(rounds):
            topic = TOPICS[(c + r * streams) % len(TOPICS)]
            out.append(await one_request(engine, f"Write a long story about {topic}.", tokens))
        return out

    per_client = await asyncio.gather(*(client(c) for c in range(streams)))
    return [s for samples in per_client for s in samples]


def aggregate_decode(samples: list[Sample]) -> float:
    spans = sorted((s.first, s.finished) for s in samples)
    covered, end = 0.0, float("-inf")
    for a, b in spans:
        if b > end:
            covered += b - max(a, end)
            end = b
    tokens = sum(max(0, s.tokens - 1) for s in samples)
    return tokens / covered if covered > 0 else 0.0


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


@dataclass
class Row:
    agg_decode: float
    ttft_p50: float
    ttft_p99: float
    mean_batch: float | None
    busy: float | None  # share of the run's wall time spent inside llama_decode
    step: float | None  # median llama_decode of this run's full decode-only steps
    limit: tuple[float, float]  # (t1, t8) measured around this row's run


async def bench_engine(
    name: str, engine: Engine, probe: LimitProbe, rounds: int, tokens: int
) -> dict[int, Row]:
    await engine.start()
    rows = {}
    try:
        for n in STREAMS:
            before = engine.stats() if isinstance(engine, BatchingLlamaEngine) else None
            l1 = probe.measure()
            started = time.perf_counter()
            samples = await load_test(engine, n, rounds, tokens)
            wall = time.perf_counter() - started
            l2 = probe.measure()
            ttft = [(s.first - s.submitted) * 1000 for s in samples]
            batch = busy = step = None
            if isinstance(engine, BatchingLlamaEngine) and before is not None:
                after = engine.stats()
                steps = after.steps - before.steps
                seqs = after.mean_batch_sequences * after.steps
                seqs -= before.mean_batch_sequences * before.steps
                batch = seqs / steps if steps else None
                busy = (after.busy_seconds - before.busy_seconds) / wall
                full = engine.decode_step_seconds(n)
                step = statistics.median(full) if full else None
            rows[n] = Row(
                aggregate_decode(samples),
                pct(ttft, 0.5),
                pct(ttft, 0.99),
                batch,
                busy,
                step,
                ((l1[0] + l2[0]) / 2, (l1[1] + l2[1]) / 2),
            )
            print(f"  {name:<9} {n} streams done", file=sys.stderr)
    finally:
        await engine.aclose()
    return rows


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    default_model = REPO / "models/SmolLM2-135M-Instruct.Q4_1.gguf"
    parser.add_argument("--model", type=Path, default=default_model)
    parser.add_argument("--tokens", type=int, default=64, help="max_tokens per request")
    parser.add_argument("--rounds", type=int, default=2, help="requests per stream")
    parser.add_argument("--chunk", type=int, default=128, help="batching prefill chunk")
    args = parser.parse_args()

    probe = LimitProbe(args.model, args.chunk)
    t1, t8 = probe.measure()
    print(
        f"machine limit ({THREADS} threads), at start: llama_decode 1 token {t1 * 1000:.1f} ms, "
        f"8-token batch {t8 * 1000:.1f} ms -> {1 / t1:.0f} vs {8 / t8:.0f} tok/s "
        f"(limit {8 * t1 / t8:.2f}x a single stream)"
    )
    single = await bench_engine(
        "single",
        LlamaCppEngine(
            LlamaSettings(model_path=args.model, model_name="bench", n_ctx=CTX, n_threads=THREADS)
        ),
        probe,
        args.rounds,
        args.tokens,
    )
    batching = await bench_engine(
        "batching",
        BatchingLlamaEngine(
            BatchingSettings(
                model_path=args.model,
                model_name="bench",
                slots=max(STREAMS),
                ctx_per_slot=CTX,
                chunk_tokens=args.chunk,
                n_threads=THREADS,
            )
        ),
        probe,
        args.rounds,
        args.tokens,
    )
    probe.model.close()
    print(
        f"{args.rounds} requests per stream, max_tokens={args.tokens}, temperature 0\n"
        "probe limit: a separate context's 8-token batch, measured just before and after the row;\n"
        "in-run: the same engine's own full decode-only steps in that row (n tokens, one call)\n"
        f"{'streams':>7}  {'engine':<9} {'agg decode':>10} {'probe limit':>11} {'x probe':>7} "
        f"{'in-run':>7} {'x in-run':>8} {'TTFT p50':>8} {'TTFT p99':>8} {'batch':>5} "
        f"{'in decode':>9}\n"
        f"{'':>7}  {'':<9} {'tok/s':>10} {'tok/s':>11} {'':>7} {'tok/s':>7} {'':>8} "
        f"{'ms':>8} {'ms':>8}"
    )
    for n in STREAMS:
        for name, rows in (("single", single), ("batching", batching)):
            row = rows[n]
            lim = 8 / row.limit[1]
            inrun = "" if row.step is None else f"{n / row.step:.1f}"
            x_inrun = "" if row.step is None else f"{row.agg_decode * row.step / n:.2f}"
            batch = "" if row.mean_batch is None else f"{row.mean_batch:.1f}"
            busy = "" if row.busy is None else f"{row.busy:.1%}"
            print(
                f"{n:>7}  {name:<9} {row.agg_decode:>10.1f} {lim:>11.1f} "
                f"{row.agg_decode / lim:>7.2f} {inrun:>7} {x_inrun:>8} "
                f"{row.ttft_p50:>8.0f} {row.ttft_p99:>8.0f} {batch:>5} {busy:>9}"
            )
    b8, s8 = batching[8], single[8]
    lim8 = 8 / b8.limit[1]
    inrun8 = 8 / b8.step if b8.step else float("nan")
    print(
        f"target: batching aggregate decode at 8 streams {b8.agg_decode:.1f} tok/s = "
        f"{b8.agg_decode / inrun8:.2f}x the in-run limit {inrun8:.1f} "
        f"(>= 0.85x: {verdict(b8.agg_decode >= 0.85 * inrun8)}), "
        f"{b8.agg_decode / lim8:.2f}x the probe limit {lim8:.1f} "
        f"(>= 0.85x: {verdict(b8.agg_decode >= 0.85 * lim8)})\n"
        f"target: P99 TTFT at 8 streams batching {b8.ttft_p99:.0f} ms vs single "
        f"{s8.ttft_p99:.0f} ms (lower: {verdict(b8.ttft_p99 < s8.ttft_p99)})"
    )


def verdict(ok: bool) -> str:
    return "met" if ok else "MISSED"


if __name__ == "__main__":
    asyncio.run(main())
