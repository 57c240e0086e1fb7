"""``hybrid-llm bench``: argument parsing and the run; everything else is in the
modules beside this one."""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import time
from pathlib import Path

from rich.console import Console

from hybrid_llm.bench.conversations import BUILTIN, builtin_workload
from hybrid_llm.bench.datasets import dataset_workload
from hybrid_llm.bench.plot import write_plot
from hybrid_llm.bench.report import build_report, compare, print_report
from hybrid_llm.bench.runner import LoadStep, RunPlan, StepRun, Variant, run_plan
from hybrid_llm.bench.workload import Source, Workload, parse_bucket

__all__ = ["register"]

EXIT_REGRESSION = 3


def _floats(text: str) -> list[float]:
    try:
        values = [float(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected numbers like 1,2,4, got {text!r}") from None
    if not values or any(v <= 0 for v in values):
        raise argparse.ArgumentTypeError(f"expected positive numbers, got {text!r}")
    return values


def _header(text: str) -> tuple[str, str]:
    name, sep, value = text.partition(":")
    if not sep or not name.strip():
        raise argparse.ArgumentTypeError(f"header {text!r}: expected NAME:VALUE")
    return name.strip(), value.strip()


def parse_variant(text: str) -> Variant:
    """``NAME`` or ``NAME:key=value,...``: ``model=X`` sets the body's model (the
    router pins a tier by the model aliases ``edge``/``center``); any other key is
    a request header."""
    name, _, rest = text.partition(":")
    headers: dict[str, str] = {}
    model: str | None = None
    for item in filter(None, rest.split(",")):
        key, sep, value = item.partition("=")
        if not sep:
            raise argparse.ArgumentTypeError(f"variant {text!r}: expected key=value")
        if key.strip() == "model":
            model = value.strip()
        else:
            headers[key.strip()] = value.strip()
    if not name:
        raise argparse.ArgumentTypeError(f"variant {text!r}: needs a name")
    return Variant(name, headers, model)


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "bench",
        help="drive load at an OpenAI-compatible URL and report TTFT/TPOT/E2E",
        description="Load generator for any OpenAI-compatible server (streaming).",
    )
    p.add_argument(
        "--url",
        default="http://127.0.0.1:8080",
        help="base URL (without /v1); several comma-separated (routers sharing one fleet) "
        "take requests in turn",
    )
    p.add_argument("--model", default="auto")
    p.add_argument("--api", choices=("chat", "completions"), default="chat")
    p.add_argument("--api-key", default=os.environ.get("HYBRID_LLM_API_KEY"))
    load = p.add_mutually_exclusive_group()
    load.add_argument("--concurrency", type=_floats, help="stepped concurrency, e.g. 1,2,4,8")
    load.add_argument("--rate", type=_floats, help="Poisson request rates per s, e.g. 1,2,4")
    p.add_argument("--duration", type=float, default=10.0, help="seconds per step")
    p.add_argument("--requests", type=int, default=200, help="max requests per step")
    p.add_argument(
        "--warmup", type=int, default=1, help="requests per variant sent before measuring"
    )
    p.add_argument(
        "--warmup-concurrency",
        type=int,
        default=1,
        help="warm-up requests in flight at once (N warms N engine slots and connections)",
    )
    what = p.add_mutually_exclusive_group()
    what.add_argument(
        "--workload",
        choices=sorted(BUILTIN),
        default="realistic",
        help="built-in conversation workload (default: realistic, a mix of the others)",
    )
    what.add_argument(
        "--dataset",
        type=Path,
        help="conversations from a file: OpenAI message lists, ShareGPT or aiperf JSON(L)",
    )
    what.add_argument(
        "--bucket",
        type=parse_bucket,
        action="append",
        help="synthetic filler prompts of PROMPT:OUTPUT[:WEIGHT] tokens (repeatable)",
    )
    p.add_argument(
        "--dataset-format", choices=("auto", "openai", "sharegpt", "aiperf"), default="auto"
    )
    p.add_argument(
        "--max-tokens", type=int, default=64, help="answer length where the workload sets none"
    )
    p.add_argument("--header", type=_header, action="append", default=[], help="NAME:VALUE")
    p.add_argument(
        "--variant",
        type=parse_variant,
        action="append",
        help="NAME[:model=M,Header=value,...]: run every step once per variant (repeatable)",
    )
    p.add_argument("--timeout", type=float, default=120.0)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", type=Path, help="JSON report path (default bench/results/...)")
    p.add_argument("--plot", type=Path, help="PNG path (default beside the JSON)")
    p.add_argument("--no-plot", action="store_true")
    p.add_argument("--knee-metric", default="ttft_ms.p99")
    p.add_argument("--baseline", type=Path, help="earlier JSON report to compare against")
    p.add_argument("--tolerance", type=float, default=0.10, help="allowed relative worsening")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    console = Console(stderr=True)
    if args.rate:
        steps = [LoadStep("rate", v) for v in args.rate]
    else:
        steps = [LoadStep("concurrency", max(1, round(v))) for v in args.concurrency or [1.0]]
    common = dict(args.header)
    variants = args.variant or [Variant("default")]
    variants = [Variant(v.name, {**common, **v.headers}, v.model) for v in variants]
    workload: Source
    if args.bucket:
        workload = Workload(model=args.model, buckets=args.bucket, api=args.api, seed=args.seed)
    elif args.api != "chat":
        console.print("[red]conversation workloads are chat; use --bucket for --api completions")
        return 2
    elif args.dataset is not None:
        try:
            workload = dataset_workload(
                args.dataset,
                args.model,
                fmt=args.dataset_format,
                max_tokens=args.max_tokens,
                seed=args.seed,
            )
        except (OSError, ValueError) as exc:
            console.print(f"[red]{exc}")
            return 2
    else:
        workload = builtin_workload(
            args.workload, args.model, max_tokens=args.max_tokens, seed=args.seed
        )
    urls = [u.strip().rstrip("/") for u in args.url.split(",") if u.strip()]
    if not urls:
        console.print("[red]--url: no URL given")
        return 2
    plan = RunPlan(
        url=urls[0],
        more_urls=tuple(urls[1:]),
        workload=workload,
        steps=steps,
        variants=variants,
        duration=args.duration,
        max_requests=args.requests,
        warmup=args.warmup,
        warmup_concurrency=max(1, args.warmup_concurrency),
        api_key=args.api_key,
        timeout=args.timeout,
        seed=args.seed,
    )

    def progress(step: StepRun) -> None:
        ok = sum(r.ok for r in step.records)
        console.print(
            f"[dim]{step.variant} {step.step.label}: {ok}/{len(step.records)} ok "
            f"in {step.wall:.1f}s"
        )

    runs = asyncio.run(run_plan(plan, progress))
    report = build_report(plan, runs, args.knee_metric)
    out: Path = args.out or Path("bench") / "results" / time.strftime("bench-%Y%m%d-%H%M%S.json")
    out.parent.mkdir(parents=True, exist_ok=True)
    print_report(report, Console(width=max(Console().width, 160)))
    code = 0
    if args.baseline:
        baseline = json.loads(args.baseline.read_text(encoding="utf-8"))
        regressions = compare(report, baseline, tolerance=args.tolerance)
        report["regressions"] = [str(r) for r in regressions]
        for r in regressions:
            console.print(f"[red]regression: {r}")
        if regressions:
            code = EXIT_REGRESSION
        else:
            console.print(f"[green]no regression against {args.baseline}")
    out.write_text(json.dumps(report, indent=1), encoding="utf-8")
    console.print(f"report: {out}")
    if not args.no_plot:
        png = args.plot or out.with_suffix(".png")
        write_plot(report, png)
        console.print(f"plot: {png}")
    total = sum(len(r.records) for r in runs)
    if total and not any(rec.ok for r in runs for rec in r.records):
        console.print("[red]every request failed")
        return code or 1
    return code
