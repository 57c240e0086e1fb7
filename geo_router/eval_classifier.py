"""Accuracy and latency of the difficulty classifier on the held-out split.

    python -m geo_router.eval_classifier [--weights FILE] [--threshold T]
    geo-router eval-classifier

The labelled set is ``geo_router/data/difficulty.jsonl`` (Chinese and
English prompts, ``split`` = train | test); the bundled weights were fitted
on the train split only, so the test figures are honest.
"""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Sequence
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

from geo_router.classifier import DifficultyClassifier

__all__ = ["Example", "evaluate", "load_examples", "main"]


@dataclass(frozen=True, slots=True)
class Example:
    text: str
    label: str
    lang: str
    split: str


def load_examples(path: Path | None = None) -> list[Example]:
    if path is None:
        res = resources.files("geo_router").joinpath("data/difficulty.jsonl")
        text = res.read_text(encoding="utf-8")
    else:
        text = path.read_text(encoding="utf-8")
    return [Example(**json.loads(line)) for line in text.splitlines() if line.strip()]


def evaluate(clf: DifficultyClassifier, examples: Sequence[Example]) -> dict[str, object]:
    """Accuracy overall and per language, and per-call latency percentiles (µs)."""
    correct: dict[str, list[int]] = {}
    latencies: list[float] = []
    for ex in examples:
        body = {"messages": [{"role": "user", "content": ex.text}]}
        start = time.perf_counter()
        result = clf.classify(body)
        latencies.append((time.perf_counter() - start) * 1e6)
        ok = int(result.difficulty == ex.label)
        for key in ("all", ex.lang):
            correct.setdefault(key, []).append(ok)
    # Latency again over many repetitions, so percentiles are not noise.
    for _ in range(20):
        for ex in examples:
            body = {"messages": [{"role": "user", "content": ex.text}]}
            start = time.perf_counter()
            clf.classify(body)
            latencies.append((time.perf_counter() - start) * 1e6)
    latencies.sort()
    return {
        "n": len(examples),
        "accuracy": {k: round(sum(v) / len(v), 4) for k, v in correct.items()},
        "latency_us": {
            "p50": round(latencies[len(latencies) // 2], 1),
            "p99": round(latencies[int(len(latencies) * 0.99)], 1),
            "max": round(latencies[-1], 1),
        },
    }


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="geo-router eval-classifier", description=__doc__)
    add_arguments(parser)
    return run(parser.parse_args(argv))


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--weights", type=Path, default=None)
    parser.add_argument("--threshold", type=float, default=0.5)
    parser.add_argument("--data", type=Path, default=None)


def run(args: argparse.Namespace) -> int:
    clf = DifficultyClassifier.load(args.weights, args.threshold)
    examples = load_examples(args.data)
    report = {
        split: evaluate(clf, [e for e in examples if e.split == split])
        for split in ("train", "test")
    }
    print(json.dumps({"threshold": args.threshold, **report}, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
