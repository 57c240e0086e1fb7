"""Where a bench run's TTFT prediction error lies: whole-prompt repeats against
the rest, per instance, and the requests that cost the most.

    .venv/bin/python -m studies.prediction_split var/bench-sg60.json [more.json ...]
        [--worst 8]

Reads ``hybrid-llm bench --out`` reports (each request's measured TTFT, the
router's predicted one, the engine's prompt and cached token counts and, from
``X-Route-Prediction``, what the router believed: its rule, prompt token count,
cached count there, its wait, the instance's own and the running count). A
*repeat* is a request the engine found cached but for at most one prompt token.
The worst requests are listed with the router's beliefs beside the engine's
counts, so a prediction made on a wrong belief (a cached count short of the
engine's, a sequence counted running) shows as such.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Iterable
from dataclasses import fields
from pathlib import Path

from hybrid_llm.bench.client import RequestRecord
from hybrid_llm.bench.stats import prediction_error

__all__ = ["is_repeat", "load_records", "split"]

_FIELDS = {f.name for f in fields(RequestRecord)}


def load_records(path: Path) -> list[RequestRecord]:
    """Every request of every step of one bench report."""
    report = json.loads(path.read_text())
    return [
        RequestRecord(**{k: v for k, v in raw.items() if k in _FIELDS})
        for step in report["steps"]
        for raw in step["requests"]
    ]


def is_repeat(r: RequestRecord) -> bool:
    """All but at most one prompt token cached by the engine."""
    return r.prompt_tokens > 0 and r.cached_tokens >= r.prompt_tokens - 1


def _line(label: str, records: Iterable[RequestRecord]) -> str:
    error = prediction_error(records)
    if not error["n"]:
        return f"  {label}: none"
    return (
        f"  {label}: n={error['n']}, MAPE {error['mape'] * 100:.0f}%"
        f" (median {error['median_ape'] * 100:.0f}%),"
        f" under-predicted {error['under_share'] * 100:.0f}%"
    )


def split(records: list[RequestRecord], worst: int) -> list[str]:
    """The report's lines: overall, repeats and the rest (each per instance), the worst."""
    scored = [r for r in records if r.ok and r.predicted_ttft is not None and r.ttft]
    lines = [_line("all", scored)]
    for name, part in (
        ("repeats", [r for r in scored if is_repeat(r)]),
        ("the rest", [r for r in scored if not is_repeat(r)]),
    ):
        lines.append(_line(name, part))
        for instance in sorted({r.instance for r in part}):
            lines.append("  " + _line(instance, [r for r in part if r.instance == instance]))
    for basis in sorted({r.route_basis for r in scored}):
        lines.append(_line(f"basis {basis}", [r for r in scored if r.route_basis == basis]))
    lines.append(
        "  worst: #  instance  basis  engine prompt/cached  router prompt/cached  "
        "wait reported running  predicted/TTFT ms  error"
    )
    ranked = sorted(enumerate(scored), key=lambda p: -_ape(p[1]))
    for i, r in ranked[:worst]:
        assert r.predicted_ttft is not None
        assert r.ttft is not None
        lines.append(
            f"    {i:>3} {r.instance:<7} {r.route_basis:<8}"
            f" {r.prompt_tokens:>5}/{r.cached_tokens:<5}"
            f" {_n(r.router_prompt_tokens):>5}/{_n(r.router_cached_tokens):<5}"
            f" {_n(r.router_wait_ms):>5} {_n(r.router_reported_wait_ms):>5}"
            f" {_n(r.router_running):>3}"
            f" {r.predicted_ttft * 1e3:>8.0f}/{r.ttft * 1e3:<8.0f} {_ape(r) * 100:>5.0f}%"
        )
    return lines


def _ape(r: RequestRecord) -> float:
    assert r.predicted_ttft is not None
    assert r.ttft
    return abs(r.predicted_ttft - r.ttft) / r.ttft


def _n(value: float | None) -> str:
    return "-" if value is None else f"{value:.0f}"


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("reports", nargs="+", type=Path)
    parser.add_argument("--worst", type=int, default=8)
    args = parser.parse_args(argv)
    for path in args.reports:
        print(path.name)
        for line in split(load_records(path), args.worst):
            print(line)


if __name__ == "__main__":
    main()
