"""The edge agent on vLLM against `vllm serve` called directly, and the edge's
best llama.cpp engine against raw vLLM at 8 streams, on this machine's CPU.

Part 1, one vLLM server: the edge agent (configs/edge-vllm-cpu.yaml settings,
prefix caching off so no request is helped by an earlier one) launches
`vllm serve` on a port this script picks; requests then go either to that
port (direct) or to the agent, taking turns in ABBA order. Both requests of a
pair send the same prompt (a new one per pair), so the pair cancels prompt
cost and drift. Printed: the
median over pairs of agent/direct TTFT (goal <= 1.05) and of agent/direct
decode rate (goal >= 0.95; decode = (tokens - 1) / (E2E - TTFT)), and the
ratio of the two sides' medians.

Part 2, 8 streams (closed loop, each stream sends its next request when the
previous one ends, fresh chat prompts, at most `--tokens` each, no forced
length) for
`--seconds`: raw vLLM (direct port), then the agent on vLLM, then the agent's
best llama.cpp engine (`llama-batching`, 8 slots, both cores) in a fresh
process. Printed per row: aggregate decode tokens/s (tokens after each
request's first, over the run's wall time), end-to-end output tokens/s, TTFT
p50/p99, requests, mean output tokens per request, and answers that streamed
no text (left out of the rates).

Run under the bench lock (the CPU is shared):
    .venv/bin/python -m studies.edge_vllm
Figures and their history: studies/edge_vllm.results.md.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import yaml

from hybrid_llm.bench.client import RequestRecord, send_streaming
from hybrid_llm.local.servers import free_port, wait_ready

REPO = Path(__file__).resolve().parents[1]

MODEL = "smollm2-135m-instruct"
WORDS = ("Rivers", "Mountains", "Deserts", "Forests", "Oceans", "Islands", "Valleys", "Lakes")


def prompts() -> Iterator[str]:
    n = 0
    while True:
        n += 1
        word = WORDS[n % len(WORDS)]
        yield f"{word} number {n}: write a short paragraph about {word.lower()} of the world."


def vllm_engine(engine_port: int, cache: Path) -> dict[str, Any]:
    base = yaml.safe_load((REPO / "configs" / "edge-vllm-cpu.yaml").read_text())["engine"]
    base.update(
        port=engine_port,
        enable_prefix_caching=False,
        cache_dir=str(cache / "vllm-cache"),
        log_dir=str(cache / "logs"),
    )
    return dict(base)


def llama_engine() -> dict[str, Any]:
    base = yaml.safe_load((REPO / "configs" / "edge-local.yaml").read_text())["engine"]
    base.update(slots=8, n_threads=2, model_path=str(REPO / base["model_path"]))
    return dict(base)


@contextmanager
def edge_agent(engine: dict[str, Any], tmp: Path, name: str) -> Iterator[str]:
    port = free_port()
    config = tmp / f"{name}.yaml"
    settings = {
        "server": {"host": "127.0.0.1", "port": port, "log_level": "warning"},
        "instance": {"id": name, "region": "bench", "version": "v1"},
        "engine": engine,
        "admission": {"max_waiting": 64},
    }
    config.write_text(yaml.safe_dump(settings))
    env = dict(os.environ, PYTHONPATH=str(REPO))
    proc = subprocess.Popen(
        [sys.executable, "-m", "edge_agent", "serve", "--config", str(config)],
        cwd=REPO,
        env=env,
        start_new_session=True,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        wait_ready(url, 600, alive=lambda: proc.poll() is None)
        yield url
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


def body(prompt: str, tokens: int) -> dict[str, Any]:
    """Part 1's completion, both sides vLLM: at most ``tokens``, the same on both sides."""
    return {
        "model": MODEL,
        "prompt": prompt,
        "max_tokens": tokens,
        # No min_tokens: the agent drops engine-native fields from clients. Greedy
        # decoding of the same prompt on the same server gives both sides of a pair
        # the same answer, so the pair still matches. (A raw completion on the
        # llama.cpp engines mostly ends at once: part 2 sends chat instead.)
        "temperature": 0,
        "stream": True,
        "stream_options": {"include_usage": True},
    }


def chat_body(prompt: str, tokens: int) -> dict[str, Any]:
    """Part 2's request on every engine: a chat turn, as users send, no forced length."""
    return {
        "model": MODEL,
        "messages": [{"role": "user", "content": prompt}],
        "max_tokens": tokens,
        "temperature": 0,
        "stream": True,
        "stream_options": {"include_usage": True},
    }


def decode_rate(r: RequestRecord) -> float | None:
    if r.ttft is None or r.e2e is None or r.output_tokens < 2 or r.e2e <= r.ttft:
        return None
    return (r.output_tokens - 1) / (r.e2e - r.ttft)


async def pairs(direct: str, agent: str, runs: int, tokens: int) -> list[tuple[Any, Any]]:
    """ABBA-ordered pairs (direct record, agent record) with matched prompts."""
    gen = prompts()
    out: list[tuple[Any, Any]] = []
    async with httpx.AsyncClient(timeout=120) as client:
        for i in range(runs + 2):
            # The same prompt on both sides (prefix caching is off): the pair's costs match.
            prompt = next(gen)
            order = [(direct, prompt), (agent, prompt)]
            if i % 2:
                order.reverse()
            got: dict[str, RequestRecord] = {}
            for url, prompt in order:
                got[url] = await send_streaming(
                    client,
                    url + "/v1/completions",
                    body(prompt, tokens),
                    bucket="pair",
                    run_start=0.0,
                )
                assert got[url].status == 200, got[url].error
            if i >= 2 and all(r.ok and r.output_tokens > 1 for r in got.values()):
                # The first two pairs warm both paths.
                out.append((got[direct], got[agent]))
    return out


@dataclass
class Row:
    name: str
    requests: int
    decode_tps: float
    e2e_tps: float
    ttft_p50_ms: float
    ttft_p99_ms: float
    tokens_per_request: float
    empty: int  # answers that streamed no text (not counted in the rates)


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    k = min(len(ordered) - 1, max(0, round(q * (len(ordered) - 1))))
    return ordered[k]


async def streams(name: str, url: str, n: int, seconds: float, tokens: int) -> Row:
    gen = prompts()
    records: list[RequestRecord] = []
    empty = 0
    async with httpx.AsyncClient(timeout=300, limits=httpx.Limits(max_connections=64)) as client:
        # Warm the path at this width once, unrecorded.
        await asyncio.gather(
            *(
                send_streaming(
                    client,
                    url + "/v1/chat/completions",
                    chat_body(next(gen), 4),
                    bucket="w",
                    run_start=0.0,
                )
                for _ in range(n)
            )
        )
        start = time.perf_counter()
        deadline = start + seconds

        async def worker() -> None:
            nonlocal empty
            while time.perf_counter() < deadline:
                r = await send_streaming(
                    client,
                    url + "/v1/chat/completions",
                    chat_body(next(gen), tokens),
                    bucket="s",
                    run_start=start,
                )
                if r.ok:
                    records.append(r)
                elif r.status != 200 or (r.error or "").startswith("HTTP"):
                    raise AssertionError(r.error)
                else:  # an answer of special tokens only streams no text
                    empty += 1

        await asyncio.gather(*(worker() for _ in range(n)))
        wall = time.perf_counter() - start
    ttft = [r.ttft * 1000 for r in records if r.ttft is not None]
    decoded = sum(max(0, r.output_tokens - 1) for r in records)
    produced = sum(r.output_tokens for r in records)
    return Row(
        name,
        len(records),
        decoded / wall,
        produced / wall,
        pct(ttft, 0.5),
        pct(ttft, 0.99),
        produced / max(1, len(records)),
        empty,
    )


def print_rows(rows: list[Row], n: int) -> None:
    print(f"\n{n} streams, closed loop")
    print(
        f"{'engine':<28}{'requests':>9}{'decode tok/s':>14}{'e2e tok/s':>11}"
        f"{'TTFT p50 ms':>13}{'TTFT p99 ms':>13}{'tok/req':>9}{'empty':>7}"
    )
    for r in rows:
        print(
            f"{r.name:<28}{r.requests:>9}{r.decode_tps:>14.1f}{r.e2e_tps:>11.1f}"
            f"{r.ttft_p50_ms:>13.1f}{r.ttft_p99_ms:>13.1f}"
            f"{r.tokens_per_request:>9.1f}{r.empty:>7}"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=32, help="matched pairs in part 1")
    parser.add_argument("--tokens", type=int, default=32, help="output tokens per request")
    parser.add_argument("--streams", type=int, default=8)
    parser.add_argument("--seconds", type=float, default=30.0, help="length of each 8-stream row")
    args = parser.parse_args()

    with tempfile.TemporaryDirectory(prefix="bench-edge-vllm-") as tmp_name:
        tmp = Path(tmp_name)
        engine_port = free_port()
        direct = f"http://127.0.0.1:{engine_port}"
        started = time.monotonic()
        with edge_agent(vllm_engine(engine_port, tmp), tmp, "edge-vllm") as agent:
            print(f"edge agent on vLLM ready in {time.monotonic() - started:.0f} s")
            matched = asyncio.run(pairs(direct, agent, args.runs, args.tokens))
            ttft_ratio = [a.ttft / d.ttft for d, a in matched]
            dec = [(decode_rate(d), decode_rate(a)) for d, a in matched]
            dec_ratio = [a / d for d, a in dec if a and d]
            med = statistics.median
            print(
                f"\npart 1: {len(matched)} matched pairs, {args.tokens} tokens each, "
                "same vLLM server"
            )
            d_ttft = med(d.ttft for d, _ in matched) * 1000
            a_ttft = med(a.ttft for _, a in matched) * 1000
            print(f"  TTFT median: direct {d_ttft:.1f} ms, agent {a_ttft:.1f} ms")
            d_dec = med(d for d, _ in dec if d)
            a_dec = med(a for _, a in dec if a)
            print(f"  decode median: direct {d_dec:.1f} tok/s, agent {a_dec:.1f} tok/s")
            tr, dr = med(ttft_ratio), med(dec_ratio)
            print(
                f"  agent/direct TTFT, paired median: {tr:.3f} (ratio of medians "
                f"{a_ttft / d_ttft:.3f})  goal <= 1.05: {'met' if tr <= 1.05 else 'NOT met'}"
            )
            print(
                f"  agent/direct decode, paired median: {dr:.3f} (ratio of medians "
                f"{a_dec / d_dec:.3f})  goal >= 0.95: {'met' if dr >= 0.95 else 'NOT met'}"
            )
            rows = [
                asyncio.run(streams("vLLM direct", direct, args.streams, args.seconds, args.tokens))
            ]
            rows.append(
                asyncio.run(
                    streams("edge agent on vLLM", agent, args.streams, args.seconds, args.tokens)
                )
            )
        with edge_agent(llama_engine(), tmp, "edge-llama") as agent:
            rows.append(
                asyncio.run(
                    streams(
                        "edge agent llama-batching", agent, args.streams, args.seconds, args.tokens
                    )
                )
            )
        print_rows(rows, args.streams)
        raw, llama = rows[0], rows[2]
        print(
            f"\nllama-batching / raw vLLM at {args.streams} streams: aggregate decode "
            f"{llama.decode_tps / raw.decode_tps:.2f}x, P99 TTFT "
            f"{llama.ttft_p99_ms / raw.ttft_p99_ms:.2f}x"
        )


if __name__ == "__main__":
    main()
