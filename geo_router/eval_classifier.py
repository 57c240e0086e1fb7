"""Accuracy and latency of the difficulty classifier on the held-out split.

    geo-router eval-classifier [--weights FILE] [--threshold T] [--data FILE] [--json]

The labelled set is ``geo_router/data/difficulty.jsonl``: one OpenAI message
list per line with ``label`` (simple | hard), ``lang`` (en | zh),
``category`` and ``split`` (train | test). Categories: ``plain`` (one short
message), ``short-but-hard``, ``system-prompt`` (a system prompt, often a
long customer-service one, before the question), ``multi-turn`` (history
before the latest turn; the label is the latest turn's), ``long-context``
(a pasted document or a RAG context with a question about it) and ``code``
(pasted code with a question). The split is by piece: system prompts,
documents, code snippets, histories and questions of the test split never
appear in training, so the bundled weights' test figures are honest.

Labels say whether a small edge model (7B class) answers well: lookups,
extraction from given text, chit-chat, short translations and FAQs are
simple; multi-step reasoning, proofs, design, non-trivial code and deep
explanations of technical or scientific ideas are hard.

Latency is per :meth:`DifficultyClassifier.classify` call (the whole body:
reading the conversation and scoring), over every test body repeated.
"""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Sequence
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any

from geo_router.classifier import DifficultyClassifier

__all__ = ["CATEGORIES", "Example", "evaluate", "load_examples", "main"]

CATEGORIES = ("plain", "short-but-hard", "system-prompt", "multi-turn", "long-context", "code")


@dataclass(frozen=True, slots=True)
class Example:
    messages: list[dict[str, Any]]
    label: str
    lang: str
    category: str
    split: str

    def body(self) -> dict[str, Any]:
        return {"model": "auto", "messages": self.messages}


def load_examples(path: Path | None = None) -> list[Example]:
    if path is None:
        res = resources.files("geo_router").joinpath("data/difficulty.jsonl")
        text = res.read_text(encoding="utf-8")
    else:
        text = path.read_text(encoding="utf-8")
    return [Example(**json.loads(line)) for line in text.splitlines() if line.strip()]


def _pct(values: list[float], q: float) -> float:
    return round(values[min(len(values) - 1, int(len(values) * q))], 1)


def evaluate(
    clf: DifficultyClassifier, examples: Sequence[Example], repeats: int = 20
) -> dict[str, Any]:
    """Accuracy overall, per language, per category (and per category and language),
    and per-call latency percentiles (µs)."""
    correct: dict[str, list[int]] = {}
    for ex in examples:
        ok = int(clf.classify(ex.body()).difficulty == ex.label)
        keys = ("all", ex.lang, ex.category, f"{ex.category}/{ex.lang}")
        for key in keys:
            correct.setdefault(key, []).append(ok)
    bodies = [ex.body() for ex in examples]
    latencies: list[float] = []
    for _ in range(repeats):
        for body in bodies:
            start = time.perf_counter()
            clf.classify(body)
            latencies.append((time.perf_counter() - start) * 1e6)
    latencies.sort()

    def acc(key: str) -> dict[str, Any]:
        v = correct.get(key, [])
        return {"n": len(v), "accuracy": round(sum(v) / len(v), 4) if v else None}

    return {
        "n": len(examples),
        "accuracy": {k: acc(k) for k in ("all", "en", "zh")},
        "by_category": {
            c: {"all": acc(c), "en": acc(f"{c}/en"), "zh": acc(f"{c}/zh")} for c in CATEGORIES
        },
        "latency_us": {
            "p50": _pct(latencies, 0.5),
            "p99": _pct(latencies, 0.99),
            "max": round(latencies[-1], 1) if latencies else None,
            "calls": len(latencies),
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
    parser.add_argument("--json", action="store_true", help="the whole report as JSON")


def _fmt(a: dict[str, Any]) -> str:
    return "-" if a["accuracy"] is None else f"{a['accuracy'] * 100:5.1f}% ({a['n']})"


def run(args: argparse.Namespace) -> int:
    clf = DifficultyClassifier.load(args.weights, args.threshold)
    examples = load_examples(args.data)
    report = {
        split: evaluate(clf, [e for e in examples if e.split == split], repeats)
        for split, repeats in (("train", 5), ("test", 20))
    }
    if args.json:
        print(json.dumps({"threshold": args.threshold, **report}, indent=2))
        return 0
    test = report["test"]
    print(f"held-out split ({test['n']} examples), threshold {args.threshold}")
    print(f"{'category':<16}{'all':>14}{'en':>14}{'zh':>14}")
    for cat, row in test["by_category"].items():
        print(f"{cat:<16}{_fmt(row['all']):>14}{_fmt(row['en']):>14}{_fmt(row['zh']):>14}")
    acc = test["accuracy"]
    print(f"{'overall':<16}{_fmt(acc['all']):>14}{_fmt(acc['en']):>14}{_fmt(acc['zh']):>14}")
    print(f"train split overall {_fmt(report['train']['accuracy']['all'])}")
    lat = test["latency_us"]
    print(
        f"latency per classify() call: p50 {lat['p50']} us, p99 {lat['p99']} us, "
        f"max {lat['max']} us ({lat['calls']} calls)"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
