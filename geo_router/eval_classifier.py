"""The task classifier and its policy, measured on prompts nobody here wrote.

    geo-router eval-classifier [--weights FILE] [--threshold T] [--config FILE] [--json]

- **Held-out source**: MT-Bench (``data/task_eval.jsonl``: 80 questions, first
  turns and second turns with the first as history, labelled by MT-Bench's own
  categories; never trained on). Accuracy per task type, per turn, per
  language; then what the policy does with it: the share each group of
  categories sends to the center.
- **Our own cases**: the test split of ``data/difficulty.jsonl`` (zh and en),
  labelled by the documented rules of :func:`geo_router.tasks.rule_label`.
- **The dial**: for thresholds 0..1, the share of held-out requests sent to
  the center and the share of the quality gap recovered (the sum of the gaps
  of the requests sent, over the sum of all; a request's gap is its true task
  type's, ``classifier.policy.gaps``), so an operator can pick a point.
- **Acceptance** (``--feedback FILE``, the router's ``feedback_log``): the
  share of users' ratings of at least 0.5 per task type and tier.
- **Latency** of :meth:`TaskClassifier.classify` (the whole body: reading the
  conversation, features, scoring, policy), over every held-out body repeated,
  and over a 30k-character conversation.
"""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Callable, Sequence
from importlib import resources
from pathlib import Path
from typing import Any

from geo_router.classifier import TaskClassifier
from geo_router.feedback import ACCEPTED
from geo_router.policy import PolicySettings
from geo_router.reading import read
from geo_router.settings import RouterSettings
from geo_router.tasks import TASKS, rule_label
from servekit.config import load_settings

__all__ = ["acceptance", "curve", "evaluate", "load_eval", "load_own", "main"]

Row = dict[str, Any]
# MT-Bench categories where a small model loses most (both turns), and least (first turns).
HARD_GROUP = ("math", "reasoning", "coding")
SOFT_GROUP = ("writing", "roleplay", "humanities")


def _data(name: str, path: Path | None) -> list[Row]:
    if path is None:
        text = resources.files("geo_router").joinpath(f"data/{name}").read_text("utf-8")
    else:
        text = path.read_text(encoding="utf-8")
    return [json.loads(line) for line in text.splitlines() if line.strip()]


def load_eval(path: Path | None = None) -> list[Row]:
    return _data("task_eval.jsonl", path)


def load_own(path: Path | None = None) -> list[Row]:
    """Our own cases' test split, labelled by :func:`rule_label`."""
    rows = []
    for item in _data("difficulty.jsonl", path):
        if item["split"] != "test":
            continue
        last = next((m["content"] for m in reversed(item["messages"]) if m["role"] == "user"), "")
        rows.append({"messages": item["messages"], "task": rule_label(last), "lang": item["lang"]})
    return rows


def _pct(values: list[float], q: float) -> float:
    return round(values[min(len(values) - 1, int(len(values) * q))], 1)


def _acc(rows: list[Row], predicted: list[str], key: Callable[[Row], str]) -> dict[str, Any]:
    out: dict[str, list[int]] = {}
    for row, task in zip(rows, predicted, strict=True):
        ok = int(task == row["task"])
        out.setdefault("all", []).append(ok)
        out.setdefault(key(row), []).append(ok)
    return {k: {"n": len(v), "accuracy": round(sum(v) / len(v), 4)} for k, v in out.items()}


def curve(
    clf: TaskClassifier, rows: list[Row], thresholds: Sequence[float]
) -> list[dict[str, float]]:
    """Center share and quality gap recovered at each threshold of the dial."""
    gaps = clf.policy.settings.gaps
    scores = [clf.policy.score(clf.model.probabilities_of(read(r))) for r in rows]
    total = sum(gaps[r["task"]] for r in rows) or 1.0
    points = []
    for t in thresholds:
        sent = [s >= t for s in scores]
        recovered = sum(gaps[r["task"]] for r, c in zip(rows, sent, strict=True) if c)
        points.append(
            {
                "threshold": t,
                "center_share": round(sum(sent) / len(rows), 4),
                "gap_recovered": round(recovered / total, 4),
            }
        )
    return points


def _latency(clf: TaskClassifier, bodies: list[Row], repeats: int) -> dict[str, Any]:
    latencies: list[float] = []
    for _ in range(repeats):
        for body in bodies:
            start = time.perf_counter()
            clf.classify(body)
            latencies.append((time.perf_counter() - start) * 1e6)
    latencies.sort()
    return {"p50": _pct(latencies, 0.5), "p99": _pct(latencies, 0.99), "calls": len(latencies)}


def _long_conversation() -> dict[str, Any]:
    para = "The shipment left the warehouse on Monday and reached the depot on Tuesday. "
    messages: list[dict[str, str]] = [{"role": "system", "content": "You are a support agent."}]
    while sum(len(m["content"]) for m in messages) < 30_000:
        messages.append({"role": "user", "content": para * 20})
        messages.append({"role": "assistant", "content": para * 5})
    messages.append({"role": "user", "content": para * 10 + "\nWhich day did it reach the depot?"})
    return {"model": "auto", "messages": messages}


def evaluate(clf: TaskClassifier, held: list[Row], own: list[Row]) -> dict[str, Any]:
    predicted = [clf.classify(r).task for r in held]
    own_predicted = [clf.classify(r).task for r in own]
    tiers = [clf.classify(r).difficulty for r in held]

    def center(categories: Sequence[str], turns: Sequence[int] = (1, 2)) -> dict[str, int]:
        picked = [
            t
            for r, t in zip(held, tiers, strict=True)
            if r.get("category") in categories and r.get("turn", 1) in turns
        ]
        return {"center": picked.count("hard"), "n": len(picked)}

    return {
        "held_out": {
            "source": "mtbench",
            "by_task": _acc(held, predicted, lambda r: r["task"]),
            "by_turn": _acc(held, predicted, lambda r: f"turn {r.get('turn', 1)}"),
            "by_lang": _acc(held, predicted, lambda r: r["lang"]),
            "center": {
                "math/reasoning/coding": center(HARD_GROUP),
                "writing/roleplay/humanities first turns": center(SOFT_GROUP, (1,)),
                "all": {"center": tiers.count("hard"), "n": len(tiers)},
            },
        },
        "own": {
            "by_lang": _acc(own, own_predicted, lambda r: r["lang"]),
            "by_task": _acc(own, own_predicted, lambda r: r["task"]),
        },
        "curve": curve(clf, held, [i / 10 for i in range(11)]),
        "latency_us": {
            "chat": _latency(clf, held, 20),
            "30k_chars": _latency(clf, [_long_conversation()], 300),
        },
    }


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--config", type=Path, default=None, help="router YAML (its policy)")
    parser.add_argument("--weights", type=Path, default=None)
    parser.add_argument("--threshold", type=float, default=None, help="the dial (default: config)")
    parser.add_argument("--data", type=Path, default=None, help="held-out rows (task_eval.jsonl)")
    parser.add_argument("--json", action="store_true", help="the whole report as JSON")
    parser.add_argument(
        "--feedback", type=Path, default=None, help="the router's feedback_log (JSON lines)"
    )


def acceptance(path: Path) -> dict[str, dict[str, Any]]:
    """Users' acceptance per task type and tier from a router's ``feedback_log``."""
    counts: dict[str, list[int]] = {}
    for line in path.read_text(encoding="utf-8").splitlines():
        if not line.strip():
            continue
        item = json.loads(line)
        key = f"{item.get('task', '-')}/{item.get('tier', '-')}"
        row = counts.setdefault(key, [0, 0])
        row[0] += 1
        row[1] += float(item.get("rating", 0.0)) >= ACCEPTED
    return {k: {"rated": n, "accepted": round(a / n, 4)} for k, (n, a) in sorted(counts.items())}


def _fmt(a: dict[str, Any] | None) -> str:
    return "-" if a is None else f"{a['accuracy'] * 100:5.1f}% ({a['n']})"


def run(args: argparse.Namespace) -> int:
    settings = load_settings(RouterSettings, args.config).classifier
    threshold = settings.threshold if args.threshold is None else args.threshold
    policy: PolicySettings = settings.policy
    clf = TaskClassifier.load(args.weights or settings.weights, threshold, policy)
    report = evaluate(clf, load_eval(args.data), load_own())
    if args.feedback is not None:
        report["feedback"] = acceptance(args.feedback)
    if args.json:
        print(json.dumps({"threshold": threshold, **report}, indent=2))
        return 0
    held = report["held_out"]
    print(f"held-out source: MT-Bench, threshold {threshold}")
    for task in (*TASKS, "all"):
        if task in held["by_task"]:
            print(f"  {task:<14}{_fmt(held['by_task'][task]):>14}")
    for key in ("turn 1", "turn 2"):
        print(f"  {key:<14}{_fmt(held['by_turn'].get(key)):>14}")
    for key, row in held["by_lang"].items():
        if key != "all":
            print(f"  lang {key:<9}{_fmt(row):>14}")
    for group, c in held["center"].items():
        print(f"  to center: {group} {c['center']}/{c['n']}")
    own = report["own"]
    print("own cases (test split, rule labels):")
    for key in ("en", "zh", "all"):
        print(f"  {key:<14}{_fmt(own['by_lang'].get(key)):>14}")
    print("dial: threshold -> center share, quality gap recovered (held-out)")
    for p in report["curve"]:
        print(
            f"  {p['threshold']:.1f} -> {p['center_share'] * 100:5.1f}% center, "
            f"{p['gap_recovered'] * 100:5.1f}% of the gap"
        )
    lat = report["latency_us"]
    print(
        f"latency per classify(): p50 {lat['chat']['p50']} us, p99 {lat['chat']['p99']} us "
        f"({lat['chat']['calls']} calls); 30k-char conversation p50 "
        f"{lat['30k_chars']['p50']} us, p99 {lat['30k_chars']['p99']} us"
    )
    if "feedback" in report:
        print("users' acceptance per task type/tier (feedback log):")
        for key, row in report["feedback"].items():
            print(f"  {key:<22}{row['accepted'] * 100:5.1f}% of {row['rated']}")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="geo-router eval-classifier", description=__doc__)
    add_arguments(parser)
    return run(parser.parse_args(argv))


if __name__ == "__main__":
    raise SystemExit(main())
