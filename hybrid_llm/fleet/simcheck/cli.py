"""``hybrid-llm simcheck``: the command line of :mod:`hybrid_llm.fleet.simcheck`.

The method (one lock hold: profile, path, engine state, bench, profile again;
then two simulations and a table) is described in the package docstring.
``--save`` writes the measurement as JSON; ``--replay`` simulates a saved one
again without measuring, so a change to the simulator is compared on the same
bench data.
"""

from __future__ import annotations

import argparse
import asyncio
import json
from pathlib import Path

from hybrid_llm.bench.conversations import BUILTIN
from hybrid_llm.fleet.simcheck.measure import load_average, measure
from hybrid_llm.fleet.simcheck.replay import simulate
from hybrid_llm.fleet.simcheck.report import compare

__all__ = ["register", "run"]

_EXAMPLES = """examples:
  # a single edge behind a delay proxy (hybrid-llm netem), no router:
  hybrid-llm simcheck --engine-url http://127.0.0.1:8101 \\
      --bench-url http://127.0.0.1:9101 --rtt-ms 2 --edge-only --rate 2 --duration 60 \\
      --model edge --edge-load edge/a/0=http://127.0.0.1:8101
  # the local topology through the router (hybrid-llm up --netem):
  hybrid-llm simcheck --engine-url http://127.0.0.1:8101 \\
      --bench-url http://127.0.0.1:8080 --sim-config configs/local-sim.yaml \\
      --rate 0.5 --duration 90 --bucket 8:16 \\
      --edge-load edge/region-a/0=http://127.0.0.1:8101 \\
      --edge-load edge/region-b/0=http://127.0.0.1:8102 --save var/svb-0.5.json
  # a conversation workload (or --dataset FILE), each request replayed with its lengths:
  hybrid-llm simcheck --engine-url http://127.0.0.1:8101 \\
      --bench-url http://127.0.0.1:8080 --sim-config configs/local-sim.yaml \\
      --rate 0.3 --duration 90 --bucket 8:16 --workload customer-service --max-tokens 16 \\
      --profile-lengths 1,8,256,448,512 \\
      --edge-load edge/region-a/0=http://127.0.0.1:8101 \\
      --edge-load edge/region-b/0=http://127.0.0.1:8102 --save var/svb-cs.json
  # the same measurement simulated again (after a change to the simulator):
  hybrid-llm simcheck --replay var/svb-0.5.json
"""


def _lengths(text: str) -> list[int]:
    try:
        values = [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected words like 1,64,256, got {text!r}") from None
    if len(set(values)) < 2 or min(values) < 1:
        raise argparse.ArgumentTypeError(f"expected two or more positive lengths, got {text!r}")
    return values


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "simcheck",
        help="does the simulator predict what the bench measures? (one run, both numbers)",
        description=(
            "Measure an engine profile, the path's overhead and a bench run, then simulate "
            "the same fleet and print both side by side; or --replay a saved measurement."
        ),
        epilog=_EXAMPLES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--engine-url", help="an edge agent, for the profile")
    p.add_argument("--bench-url", help="what users hit (proxy or router)")
    p.add_argument("--sim-config", type=Path, help="fleet to simulate (default: --edge-only)")
    p.add_argument("--edge-only", action="store_true")
    p.add_argument("--rtt-ms", type=float, default=2.0, help="--edge-only: user<->edge RTT")
    p.add_argument("--rate", type=float, default=1.0)
    p.add_argument("--duration", type=float, default=60.0)
    p.add_argument(
        "--bucket",
        default="48:24",
        help="PROMPT:OUTPUT words of the bench's filler prompts; also the path calibration's "
        "and the mixed-step probe's prompt with --workload/--dataset",
    )
    what = p.add_mutually_exclusive_group()
    what.add_argument(
        "--workload",
        choices=sorted(BUILTIN),
        help="bench a built-in conversation workload instead of --bucket prompts "
        "(customer-service, chat: multi-turn, ...)",
    )
    what.add_argument(
        "--dataset",
        type=Path,
        help="bench conversations from a file instead (OpenAI, ShareGPT or aiperf JSON(L))",
    )
    p.add_argument(
        "--max-tokens",
        type=int,
        default=16,
        help="--workload/--dataset: answer length where the conversation sets none",
    )
    p.add_argument(
        "--profile-lengths",
        type=_lengths,
        help="prompt words the profile measures, e.g. 1,64,256,512 (default: bracketing "
        "--bucket; give lengths up to the workload's longest prompts)",
    )
    p.add_argument("--model", default="auto", help="model sent to --bench-url")
    p.add_argument("--engine-model", default="edge", help="model sent to --engine-url")
    p.add_argument(
        "--repeats",
        type=int,
        default=5,
        help="profile: requests per prompt length (their spread is the simulated prefill's)",
    )
    p.add_argument(
        "--calibrate-path",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="measure what the path (router, proxies) adds to TTFT over the engine alone "
        "and give it to the simulator as the router's overhead (default: on)",
    )
    p.add_argument(
        "--path-pairs",
        type=int,
        default=20,
        help="path calibration: direct/routed request pairs (12 before: with a third of "
        "the routed ones spilling to another region, 4-5 same-city samples moved the "
        "median by 20 ms between runs)",
    )
    p.add_argument(
        "--profile-gap",
        type=float,
        help="mean idle seconds before each profile/path request (default 1 / --rate: the "
        "engine measured in the state the bench's arrivals find it)",
    )
    p.add_argument(
        "--decode-from-bench",
        action="store_true",
        help="take the decode step from the bench's TPOT (on one machine the router, proxies "
        "and client share the cores with the engines while the bench runs)",
    )
    p.add_argument(
        "--edge-load",
        action="append",
        default=[],
        metavar="INSTANCE=URL",
        help="a simulated instance (edge/<region>/<i>) and the real one's URL: its /load "
        "just before the bench (TTFT P50/P95, rates) is the simulated one's starting state",
    )
    p.add_argument(
        "--chunk-tokens",
        type=int,
        default=128,
        help="the edge engine's prefill chunk (engine.chunk_tokens of configs/edge-local.yaml)",
    )
    p.add_argument("--save", type=Path, help="write what was measured here (JSON)")
    p.add_argument(
        "--replay",
        type=Path,
        help="simulate a saved measurement again (--save of an earlier run) instead of "
        "measuring: the simulator's model changes, the bench data stays the same",
    )
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    asyncio.run(_run(args))
    return 0


async def _run(args: argparse.Namespace) -> None:
    if args.replay:
        measured = json.loads(args.replay.read_text(encoding="utf-8"))
        saved = measured["args"]
        keys = (
            "sim_config",
            "edge_only",
            "rtt_ms",
            "rate",
            "duration",
            "bucket",
            "chunk_tokens",
            "workload",
            "dataset",
            "max_tokens",
        )
        for key in keys:
            value = saved.get(key)
            if key in saved:
                setattr(args, key, Path(value) if key == "sim_config" and value else value)
        print(f"replaying {args.replay} (measured at load {measured['load_start']})")
    else:
        measured = await measure(args)
        if args.save:
            args.save.parent.mkdir(parents=True, exist_ok=True)
            args.save.write_text(json.dumps(measured, indent=1), encoding="utf-8")
            print(f"measurement saved to {args.save}")
    compare(measured["records"], simulate(args, measured))
    print(f"load average at end: {load_average()}")
