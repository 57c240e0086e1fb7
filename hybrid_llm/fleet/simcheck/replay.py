"""The simulating half of the simulator check: the measured fleet, simulated
on the bench's own arrivals and as a long Poisson run.

:func:`sim_config` turns a measurement (:func:`hybrid_llm.fleet.simcheck.measure.measure`,
or a saved one) into a :class:`~hybrid_llm.fleet.sim.SimConfig`: the same fleet,
profile (with its mixed-step costs and dispersion), rate, prompt and output
lengths, shared prefix, router estimate, path overhead and engine state.
"""

from __future__ import annotations

import argparse
import math
import statistics
from typing import Any

from geo_router.conversation import estimate_prompt_tokens
from hybrid_llm.bench import Workload, parse_bucket
from hybrid_llm.fleet.sim import EngineProfile, SimConfig, SimResult, Simulation
from hybrid_llm.fleet.sim.request import SimRequest
from servekit.config import load_settings

__all__ = ["edge_only", "sim_config", "simulate"]


def edge_only(rtt_ms: float, rate: float) -> dict[str, Any]:
    return {
        # The center is unreachable in time, so every request stays on the edge.
        "rtt": {"same_region_ms": rtt_ms, "rtt_ms": {"a": {"far": 100_000}}},
        "regions": [{"name": "a", "edges": 1, "rate": rate}],
        "center": {"region": "far", "replicas": 1},
        "workload": {"hard_fraction": 0.0},
    }


def sim_config(args: argparse.Namespace, measured: dict[str, Any]) -> dict[str, Any]:
    """The same fleet, profile, rate and lengths as the measurement."""
    records = measured["records"]
    profile = EngineProfile.model_validate(measured["profile"])
    prompt = statistics.mean(r["prompt_tokens"] for r in records if r["prompt_tokens"])
    output = statistics.mean(r["output_tokens"] for r in records)
    # The preamble every prompt shares: the least any request found cached (later
    # prompts of one run share a few more tokens with the one before them).
    cached = [r["cached_tokens"] for r in records if r["cached_tokens"]]
    prefix = min(cached) if cached else 0
    # What the router estimates from the client's text (its own code, on the bench's bodies).
    bucket = parse_bucket(args.bucket)
    workload = Workload(args.model, [bucket])
    estimate = statistics.mean(estimate_prompt_tokens(workload.body(bucket)) for _ in range(20))
    print(
        f"profile (mean of before/after): decode step {profile.decode_base_ms:.1f} ms "
        f"+ {profile.decode_per_seq_ms:.1f} ms/extra sequence, slots {profile.slots}, "
        f"prefill points {[(x, round(y * 1000)) for x, y in profile.prefill_points]}"
    )
    print(
        f"bench: {len(records)} ok requests at {args.rate}/s; prompt {prompt:.0f} tokens "
        f"({prefix} of them a cached prefix; the router estimates {estimate:.0f}), "
        f"output {output:.1f} tokens"
    )
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
    config["workload"]["template_tokens"] = max(0, round(prompt - estimate))
    config["warm"] = measured.get("warm") or {}
    if measured["path_ms"] is not None:
        config.setdefault("policy", {})["router_overhead_ms"] = max(0.0, measured["path_ms"])
    return config


def _window(result: SimResult) -> list[SimRequest]:
    return [
        r
        for r in result.requests
        if result.measured_from <= r.arrival < result.measured_to and r.e2e is not None
    ]


def simulate(args: argparse.Namespace, measured: dict[str, Any]) -> dict[str, list[SimRequest]]:
    """Two simulations of the measured fleet: the bench's own arrival times (its
    Poisson schedule is seeded, the same every run) replayed with different seeds
    until there are 400 requests, each replay starting from the engines' state
    before the bench; and one long Poisson run at the same rate."""
    config = sim_config(args, measured)
    starts = sorted(r["start"] for r in measured["records"])
    trace = dict(config, warmup_s=0.0, duration_s=(starts[-1] if starts else 0.0) + 1.0)
    trace["regions"] = [dict(r) for r in config["regions"]]
    trace["regions"][0]["arrivals"] = starts
    replays = max(1, math.ceil(400 / max(1, len(starts))))
    traced: list[SimRequest] = []
    for seed in range(replays):
        traced += _window(Simulation(SimConfig.model_validate(trace | {"seed": seed})).run())
    config["duration_s"] = max(args.duration, 400 / max(args.rate, 1e-3))  # enough samples
    config["warmup_s"] = 5.0
    poisson = _window(Simulation(SimConfig.model_validate(config)).run())
    print(
        f"simulated: the bench's arrivals x {replays} seeds, and Poisson {config['duration_s']:g}s"
    )
    return {"sim (bench arrivals)": traced, "sim (Poisson)": poisson}
