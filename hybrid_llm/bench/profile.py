"""``hybrid-llm profile``: measure an engine profile from a running server.

Prefill rate: single requests of growing prompt length asking for one token;
TTFT against prompt tokens is fitted with a line, whose slope is the prefill
cost per token and whose intercept is the fixed overhead; the median TTFT at
each length is kept too, since real engines are not linear. Decode step time by
batch size: ``b`` concurrent streams, the median gap between tokens while all
``b`` run.

Mixed steps: a batching engine prefills a new prompt in the same step as the
next token of every running sequence, and that step costs more than the idle
prefill. For ``k`` decoders (1 to slots - 1), ``k`` long streams are started,
and once they decode (judged from the idle TTFT and step times, checked
afterwards from their timestamps: trials where a rider was not decoding from
before the probe was sent until after its first token are dropped) a probe
asks for one token of a ``mixed_prompt``-word prompt; its TTFT minus the idle
TTFT at that length is what ``k`` riders add to a prefill step.

Dispersion: every idle prefill TTFT over the median at its length, and every
inter-token gap over the median at its batch size, summarised as a few
quantiles (:mod:`hybrid_llm.fleet.sim.spread`), which the simulator draws from.

``gap_s`` puts an idle pause (exponentially distributed, that mean) before each
prefill request, so the engine is measured in the state a request arriving at
``1 / gap_s`` per second finds it. On a shared machine that state matters: on
the development VM the same 14-token llama.cpp prefill takes ~125 ms back to
back and ~230-300 ms after a 0.5-2 s pause (caches gone cold), so a
back-to-back profile underestimates what light traffic sees by half. The
result is an :class:`~hybrid_llm.fleet.sim.profiles.EngineProfile` for
``hybrid-llm simulate`` (printed as YAML).
"""

from __future__ import annotations

import argparse
import asyncio
import math
import random
import statistics
import time
from collections.abc import Sequence
from typing import Any

import httpx
import yaml

from hybrid_llm.bench.client import RequestRecord, send_streaming
from hybrid_llm.bench.workload import Bucket, Workload
from hybrid_llm.fleet.sim.profiles import EngineProfile
from hybrid_llm.fleet.sim.spread import ratios_to_median, spread_of
from hybrid_llm.local.topology import service_token

__all__ = ["fit_line", "measure_profile", "register"]


def fit_line(xs: Sequence[float], ys: Sequence[float]) -> tuple[float, float]:
    """Least-squares ``y = a + b x``; returns ``(a, b)``."""
    n = len(xs)
    mx, my = sum(xs) / n, sum(ys) / n
    sxx = sum((x - mx) ** 2 for x in xs)
    if sxx == 0:
        return my, 0.0
    b = sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / sxx
    return my - b * mx, b


async def _one(
    client: httpx.AsyncClient,
    workload: Workload,
    prompt: int,
    output: int,
    run_start: float | None = None,
) -> RequestRecord:
    bucket = Bucket(prompt, output)
    body = workload.body(bucket)
    # A raw engine that honours it keeps decoding to max_tokens. Edge agents and the
    # center drop engine-native fields from clients (the router refuses them): there
    # the engine's own ``request_fields: {ignore_eos: true}`` setting forces lengths.
    body["ignore_eos"] = True
    start = time.perf_counter() if run_start is None else run_start
    return await send_streaming(client, workload.path, body, bucket=bucket.label, run_start=start)


async def _mixed_ttft(
    client: httpx.AsyncClient,
    workload: Workload,
    prompt: int,
    riders: int,
    idle_ttft_s: float,
    step_s: float,
) -> RequestRecord | None:
    """One probe's TTFT with ``riders`` sequences decoding; ``None`` if they were not."""
    settle = riders * idle_ttft_s * 1.5 + 4 * step_s  # their prefills, then a few steps
    tokens = math.ceil((settle + 4 * idle_ttft_s) / step_s) + 8  # decoding past the probe
    t0 = time.perf_counter()
    tasks = [asyncio.create_task(_one(client, workload, prompt, tokens, t0)) for _ in range(riders)]
    await asyncio.sleep(settle)
    probe = await _one(client, workload, prompt, 1, t0)
    rides = await asyncio.gather(*tasks)
    if not probe.ok or probe.ttft is None:
        return None
    sent, first = probe.start, probe.start + probe.ttft
    for r in rides:
        if not r.ok or r.ttft is None or r.e2e is None:
            return None
        if not (r.start + r.ttft < sent and r.start + r.e2e > first):
            return None  # this rider was not decoding all along
    return probe


async def measure_profile(
    url: str,
    *,
    model: str | None = None,
    prompt_lengths: Sequence[int] = (16, 64, 256, 512),
    repeats: int = 3,
    batches: Sequence[int] | None = None,
    decode_tokens: int = 32,
    api_key: str | None = None,
    gap_s: float = 0.0,
    seed: int = 0,
    mixed_prompt: int | None = None,
    mixed_repeats: int = 3,
    mixed_riders: Sequence[int] | None = None,
) -> dict[str, Any]:
    """Measure prefill, decode and mixed-step figures of the server at ``url``
    (``mixed_prompt``: the probe's prompt words, default the first length;
    ``mixed_riders``: decoder counts, default 1 to slots - 1; ``()`` skips)."""
    rng = random.Random(seed)
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    async with httpx.AsyncClient(base_url=url, headers=headers, timeout=300) as client:
        slots = 1
        try:
            load = (await client.get("/load")).json()
            slots = int(load.get("capacity") or 1)
            model = model or load.get("model")
        except (httpx.HTTPError, ValueError, AttributeError):
            pass
        workload = Workload(model or "auto", [Bucket(16, 1)])
        await _one(client, workload, 16, 2)  # warm-up
        xs: list[float] = []
        ys: list[float] = []
        tokens_of: dict[int, int] = {}  # prompt words -> tokens the server counted
        cached: list[int] = []  # what each prompt found cached: the template's preamble
        for length in prompt_lengths:
            for _ in range(repeats):
                if gap_s > 0:
                    await asyncio.sleep(rng.expovariate(1.0 / gap_s))
                rec = await _one(client, workload, length, 1)
                if rec.ok and rec.ttft is not None:
                    xs.append(rec.prompt_tokens or length)
                    ys.append(rec.ttft)
                    tokens_of[length] = rec.prompt_tokens or length
                    cached.append(rec.cached_tokens)
        if len(set(xs)) < 2:
            raise RuntimeError(
                f"prefill measurement failed at {url}: too few successful requests "
                f"(last error: {rec.error})"
            )
        intercept, slope = fit_line(xs, ys)
        steps: dict[int, float] = {}
        step_spread: dict[int, list[tuple[float, float]]] = {}
        for b in batches or sorted({1, 2, 4, 8, slots} & set(range(1, slots + 1))):
            records = await asyncio.gather(
                *(_one(client, workload, 16, decode_tokens) for _ in range(b))
            )
            gaps = [g for r in records if r.ok for g in r.itl]
            if gaps:
                steps[b] = statistics.median(gaps)
                if spread := spread_of(ratios_to_median([gaps])):
                    step_spread[b] = spread
        by_length: dict[int, list[float]] = {}
        for x, y in zip(xs, ys, strict=True):
            by_length.setdefault(round(x), []).append(y)
        points = [(x, statistics.median(v)) for x, v in sorted(by_length.items())]
        idle = EngineProfile(
            prefill_tokens_per_s=1.0 / slope if slope > 0 else 1e9,
            decode_base_ms=1.0,
            overhead_ms=max(0.0, intercept * 1000),
            prefill_points=points,
        )
        mixed: dict[int, list[float]] = {}
        probe_words = mixed_prompt or prompt_lengths[0]
        riders_list = range(1, slots) if mixed_riders is None else mixed_riders
        for k in riders_list:
            step = steps.get(k + 1) or max(steps.values(), default=0.05)
            for _ in range(mixed_repeats):
                if gap_s > 0:
                    await asyncio.sleep(rng.expovariate(1.0 / gap_s))
                idle_s = idle.prefill_s(tokens_of.get(probe_words, probe_words))
                probe = await _mixed_ttft(client, workload, probe_words, k, idle_s, step)
                if probe is not None and probe.ttft is not None:
                    tokens = probe.prompt_tokens or probe_words
                    mixed.setdefault(k, []).append(probe.ttft - idle.prefill_s(tokens))
    base_s, per_seq_s = fit_line([b - 1 for b in steps], list(steps.values()))
    profile = EngineProfile(
        name=f"measured {url}",
        prefill_tokens_per_s=1.0 / slope if slope > 0 else 1e9,
        decode_base_ms=max(0.01, (steps.get(1) or base_s) * 1000),
        decode_per_seq_ms=max(0.0, per_seq_s * 1000) if len(steps) > 1 else 0.0,
        slots=slots,
        overhead_ms=max(0.0, intercept * 1000),
        prefill_points=points,
        mixed_points=[(k, statistics.median(v)) for k, v in sorted(mixed.items())],
        prefill_spread=spread_of(ratios_to_median(list(by_length.values()))),
        step_spread=step_spread,
    )
    return {
        "profile": profile,
        "ttft_points": list(zip(xs, ys, strict=True)),
        "step_s_by_batch": steps,
        "mixed_extra_s": mixed,
        # The prefill times hold this many tokens copied, not computed (the least
        # any profile prompt found cached: they share only the chat template's head).
        "preamble_tokens": min(cached, default=0),
    }


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "profile", help="measure prefill rate and decode step time of a running engine"
    )
    p.add_argument("--url", required=True, help="edge agent (or any OpenAI server) base URL")
    p.add_argument("--model", help="default: the model the server's /load reports")
    p.add_argument("--prompt-lengths", default="16,64,256,512")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--decode-tokens", type=int, default=32)
    p.add_argument(
        "--api-key", help="bearer token (default: the local topology's service token, if any)"
    )
    p.add_argument(
        "--mixed-prompt",
        type=int,
        help="prompt words of the mixed-step probe (default: the first --prompt-lengths)",
    )
    p.add_argument(
        "--mixed-repeats", type=int, default=3, help="mixed-step probes per rider count (0: none)"
    )
    p.add_argument(
        "--gap",
        type=float,
        default=0.0,
        help="mean idle seconds before each prefill request (1 / the request rate to model)",
    )
    p.set_defaults(func=_run)


def _run(args: argparse.Namespace) -> int:
    lengths = [int(v) for v in args.prompt_lengths.split(",") if v.strip()]
    try:
        out = asyncio.run(
            measure_profile(
                args.url.rstrip("/"),
                model=args.model,
                prompt_lengths=lengths,
                repeats=args.repeats,
                decode_tokens=args.decode_tokens,
                api_key=args.api_key or service_token(),
                gap_s=args.gap,
                mixed_prompt=args.mixed_prompt,
                mixed_repeats=args.mixed_repeats,
            )
        )
    except RuntimeError as exc:
        print(f"profile: {exc}")
        return 1
    profile: EngineProfile = out["profile"]
    print(
        "# TTFT by prompt tokens:",
        ", ".join(f"{x:.0f}:{y * 1000:.1f}ms" for x, y in out["ttft_points"]),
    )
    print(
        "# decode step by batch:",
        ", ".join(f"{b}:{s * 1000:.2f}ms" for b, s in out["step_s_by_batch"].items()),
    )
    print(
        "# prefill step added by k decoders riding along:",
        ", ".join(f"{k}:{s * 1000:.1f}ms" for k, s in profile.mixed_points) or "not measured",
    )
    print(yaml.safe_dump({"edge_profile": profile.model_dump()}, sort_keys=False), end="")
    return 0
