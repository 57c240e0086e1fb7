"""The simulating half of the simulator check: the measured fleet, simulated
on the bench's own requests (arrival times and lengths) and, for bucket
prompts, as a long Poisson run.

:func:`sim_config` turns a measurement (:func:`hybrid_llm.fleet.simcheck.measure.measure`,
or a saved one) into a :class:`~hybrid_llm.fleet.sim.SimConfig`: the same fleet,
profile (with its mixed-step costs and dispersion), rate, prompt and output
lengths, shared prefix, router estimate, path overhead and engine state.
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import statistics
from typing import Any

from geo_router.conversation import estimate_prompt_tokens
from hybrid_llm.bench import Workload, parse_bucket
from hybrid_llm.bench.workload import Source
from hybrid_llm.fleet.sim import EngineProfile, SimConfig, SimResult, Simulation
from hybrid_llm.fleet.sim.request import SimRequest
from hybrid_llm.fleet.simcheck.measure import bench_source, conversational, pool_points
from servekit.config import load_settings

__all__ = ["bench_trace", "edge_only", "sim_config", "simulate"]


def edge_only(rtt_ms: float, rate: float) -> dict[str, Any]:
    return {
        # The center is unreachable in time, so every request stays on the edge.
        "rtt": {"same_region_ms": rtt_ms, "rtt_ms": {"a": {"far": 100_000}}},
        "regions": [{"name": "a", "edges": 1, "rate": rate}],
        "center": {"region": "far", "replicas": 1},
        "workload": {"hard_fraction": 0.0},
    }


def _router_estimate(args: argparse.Namespace, n: int = 50) -> float:
    """The router's mean token estimate of the bench's first turns (its own code on
    bodies drawn as the bench draws them); a dataset no longer there: a bucket's."""
    try:
        source: Source = bench_source(args)
    except (OSError, ValueError) as exc:
        print(f"router estimate: {exc}; estimating a --bucket prompt instead")
        source = Workload(args.model, [parse_bucket(args.bucket)])
    if isinstance(source, Workload):
        # Its prompts carry a random nonce whose estimate varies by a token: a fixed
        # one keeps the simulations of one measurement alike.
        source = dataclasses.replace(source, nonce="5eed00")
    estimates = []
    for _ in range(n):
        conv = source.conversation()
        messages = [*conv.prefix, {"role": "user", "content": conv.turns[0]}]
        body = source.request_body(messages, conv.max_tokens)
        estimates.append(estimate_prompt_tokens(body))
    return statistics.mean(estimates)


def _drift(records: list[dict[str, Any]], profile: EngineProfile) -> None:
    """Say so when the engines ran slower during the bench than in both profiles:
    on a shared machine another tenant's load doubles every step for a while, which
    no simulated fleet predicts. Lone sequences (TPOT of requests that overlapped
    none on their edge is its decode step) show it."""
    spans = sorted((r["start"], r["start"] + (r["e2e"] or 0.0), r["region"]) for r in records)
    alone = [
        r["tpot"] * 1000
        for r, (start, end, region) in zip(
            sorted(records, key=lambda r: r["start"]), spans, strict=True
        )
        if r["tpot"] is not None
        and not any(s < end and e > start and g == region for s, e, g in spans if s != start)
    ]
    if len(alone) < 3:
        return
    tpot = statistics.median(alone)
    slower = tpot / profile.decode_base_ms - 1
    print(
        f"drift: the bench's lone requests decoded at {tpot:.1f} ms per token (median of "
        f"{len(alone)}), the profiles' decode step is {profile.decode_base_ms:.1f} ms"
        + (
            f": {slower:+.0%}, the machine was slower during the bench than while profiling"
            if slower > 0.2
            else ""
        )
    )


def sim_config(args: argparse.Namespace, measured: dict[str, Any]) -> dict[str, Any]:
    """The same fleet, profile, rate and lengths as the measurement."""
    records = measured["records"]
    profile = EngineProfile.model_validate(measured["profile"])
    profile.prefill_points = pool_points(profile.prefill_points)
    prompt = statistics.mean(r["prompt_tokens"] for r in records if r["prompt_tokens"])
    output = statistics.mean(r["output_tokens"] for r in records)
    # The preamble the profile's prompts shared (its prefill times hold that copy);
    # measurements saved before it was recorded: the least any bench request found
    # cached (later prompts of one run share a few more tokens with the one before).
    cached = [r["cached_tokens"] for r in records if r["cached_tokens"]]
    prefix = measured.get("preamble_tokens")
    if prefix is None:
        prefix = min(cached) if cached else 0
    # What the router estimates from the client's text (its own code, on the bench's
    # bodies): the tokens it does not see (the chat template's) are the difference.
    estimate, first = _router_estimate(args), prompt
    firsts = [r["prompt_tokens"] for r in records if r["prompt_tokens"] and r["turn"] == 0]
    if firsts:
        first = statistics.mean(firsts)
    print(
        f"profile (mean of before/after): decode step {profile.decode_base_ms:.1f} ms "
        f"+ {profile.decode_per_seq_ms:.1f} ms/extra sequence, slots {profile.slots}, "
        f"prefill points {[(x, round(y * 1000)) for x, y in profile.prefill_points]}"
    )
    prompts = [r["prompt_tokens"] for r in records if r["prompt_tokens"]]
    print(
        f"bench: {len(records)} ok requests at {args.rate}/s; prompt {prompt:.0f} tokens "
        f"(median {statistics.median(prompts):.0f}, max {max(prompts)}; "
        f"{statistics.mean(cached or [0]):.0f} cached on average, {prefix} of them the "
        f"profile's preamble; the router estimates {estimate:.0f} of a first turn's "
        f"{first:.0f}), "
        f"output {output:.1f} tokens"
    )
    _drift(records, profile)
    if args.sim_config:
        config = load_settings(SimConfig, args.sim_config).model_dump()
        config["regions"][0]["rate"] = args.rate
        for region in config["regions"][1:]:
            region["rate"] = 0.0
    else:
        config = edge_only(args.rtt_ms, args.rate)
    config["edge_profile"] = profile.model_dump() | {"chunk_tokens": args.chunk_tokens}
    config["center"]["profile"] = profile.model_dump()
    config["workload"]["prompt_tokens"] = {"kind": "fixed", "value": max(1, round(prompt))}
    config["workload"]["output_tokens"] = {"kind": "fixed", "value": max(1, round(output))}
    config["workload"]["cached_prefix_tokens"] = prefix
    config["workload"]["template_tokens"] = max(0, round(first - estimate))
    config["warm"] = measured.get("warm") or {}
    # The Poisson run's share of hard requests: those the router's classifier judged
    # hard (a conversation workload's hard questions; the bench's requests each keep
    # their own judgement).
    hard = sum(r["reason"] == "hard" for r in records) / max(1, len(records))
    config["workload"]["hard_fraction"] = hard
    if measured["path_ms"] is not None:
        config.setdefault("policy", {})["router_overhead_ms"] = max(0.0, measured["path_ms"])
    return config


def _window(result: SimResult) -> list[SimRequest]:
    return [
        r
        for r in result.requests
        if result.measured_from <= r.arrival < result.measured_to and r.e2e is not None
    ]


def _conversations(records: list[dict[str, Any]]) -> list[tuple[str, int | None]]:
    """Which conversation each record (sorted by start) belongs to and the index of
    its previous turn: a first turn opens one; a later turn continues the one whose
    previous turn ended last before it started (a client sends the next turn as the
    answer arrives)."""
    out: list[tuple[str, int | None]] = []
    open_: list[tuple[float, int, str, int]] = []  # (last turn's end, its turn, name, index)
    for index, r in enumerate(records):
        previous: int | None = None
        name = f"conversation-{index}"
        if r["turn"] > 0:
            ends = [
                (end, i)
                for i, (end, turn, _, _) in enumerate(open_)
                if turn == r["turn"] - 1 and end <= r["start"] + 0.05
            ]
            if ends:
                _, _, name, previous = open_.pop(max(ends)[1])
        out.append((name, previous))
        open_.append((_end(r), r["turn"], name, index))
    return out


def _end(record: dict[str, Any]) -> float:
    return float(record["start"] + (record["e2e"] or 0.0))


def _gap(record: dict[str, Any], previous: dict[str, Any] | None) -> float:
    """The client's pause between the previous turn's answer and this turn."""
    return 0.0 if previous is None else max(0.0, record["start"] - _end(previous))


def bench_trace(records: list[dict[str, Any]], preamble: int = 0) -> list[dict[str, Any]]:
    """The bench's requests as a simulator trace: each at its start, with the prompt,
    cached and output tokens it measured (a request without usage: the run's means),
    hard if the router's classifier judged it so. Its cached tokens are a prefix only an
    instance that served it holds: a first turn's are its workload's system prompt
    (by label), a later turn's its conversation's history. A first turn that found
    no more than the ``preamble`` cached where the bench sent it (a cold instance)
    carries what most of its label's first turns found cached elsewhere, if most
    found more (a shared system prompt): where the simulated router sends it decides
    whether it hits."""
    prompts = [r["prompt_tokens"] for r in records if r["prompt_tokens"]]
    mean_prompt = round(statistics.mean(prompts)) if prompts else 1
    ordered = sorted(records, key=lambda r: r["start"])
    # What a label's first turns found cached beyond the preamble, when most did
    # (they share a system prompt; a dataset's first turns repeat only by chance).
    firsts: dict[str, list[int]] = {}
    for r in ordered:
        if r["turn"] == 0:
            firsts.setdefault(r["bucket"], []).append(r["cached_tokens"])
    shared = {
        label: hits
        for label, cached in firsts.items()
        if len(hits := [c for c in cached if c > preamble]) > len(cached) / 2
    }
    out = []
    for r, (conversation, previous) in zip(ordered, _conversations(ordered), strict=True):
        prompt = r["prompt_tokens"] or mean_prompt
        cached = r["cached_tokens"]
        if r["turn"] == 0 and cached <= preamble and r["bucket"] in shared:
            cached = round(statistics.median(shared[r["bucket"]]))
        out.append(
            {
                "at": max(0.0, r["start"]),
                "prompt_tokens": max(1, prompt),
                "output_tokens": max(1, r["output_tokens"]),
                "cached_tokens": min(cached, max(0, prompt - 1)),
                # The router's classifier judges a text the same every time (a spill
                # to the center is the simulated router's to decide).
                "hard": r["reason"] == "hard",
                "prefix": r["bucket"] if r["turn"] == 0 else conversation,
                "conversation": conversation,
                # A later turn goes when the simulated answer before it arrives.
                "follows": previous,
                "gap_s": _gap(r, None if previous is None else ordered[previous]),
            }
        )
    return out


def simulate(
    args: argparse.Namespace, measured: dict[str, Any]
) -> dict[str, list[list[SimRequest]]]:
    """Simulations of the measured fleet: the bench's own requests (its Poisson
    schedule is seeded, the same every run), each at its start time with its own
    measured prompt, cached and output tokens, replayed with different seeds until
    there are 400 requests, each replay starting from the engines' state before the
    bench; and, for ``--bucket`` prompts, one long Poisson run at the same rate and
    the mean lengths (a conversation workload's lengths and cache hits depend on the
    turn and on each other, which a Poisson draw of lengths would not keep)."""
    config = sim_config(args, measured)
    preamble = config["workload"]["cached_prefix_tokens"]
    requests = bench_trace(measured["records"], preamble)
    last = requests[-1]["at"] if requests else 0.0
    trace = dict(config, warmup_s=0.0, duration_s=last + 1.0)
    trace["regions"] = [dict(r) for r in config["regions"]]
    trace["regions"][0]["trace"] = requests
    replays = max(1, math.ceil(400 / max(1, len(requests))))
    # Every answered request counts (a later turn may arrive after the trace's last
    # start when the simulated answers before it took longer than the bench's).
    traced = [
        [
            r
            for r in Simulation(SimConfig.model_validate(trace | {"seed": seed})).run().requests
            if r.e2e is not None
        ]
        for seed in range(replays)
    ]
    sims = {"sim (bench requests)": traced}
    if conversational(args):
        print(f"simulated: the bench's requests x {replays} seeds")
        return sims
    config["duration_s"] = max(args.duration, 400 / max(args.rate, 1e-3))  # enough samples
    config["warmup_s"] = 5.0
    sims["sim (Poisson)"] = [_window(Simulation(SimConfig.model_validate(config)).run())]
    print(
        f"simulated: the bench's requests x {replays} seeds, and Poisson {config['duration_s']:g}s"
    )
    return sims
