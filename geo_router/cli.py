"""``geo-router``: serve the router, classify prompts, evaluate the classifier.

geo-router serve --config configs/router.yaml [--host H] [--port P] [--log-level L] ...
geo-router classify [--config FILE] < requests.jsonl > difficulties.jsonl
geo-router eval-classifier [--threshold T]
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any, TextIO

from geo_router import eval_classifier
from geo_router.classifier import TaskClassifier
from geo_router.settings import RouterSettings
from servekit.config import load_settings
from servekit.serve_cli import Service, add_serve_command, run_command

__all__ = ["SERVICE", "classify_lines", "main"]


def _create_app(settings: RouterSettings) -> Any:
    from geo_router.app import create_app

    return create_app(settings)


SERVICE = Service("geo-router", RouterSettings, _create_app, config_required=False)


def classify_lines(clf: TaskClassifier, lines: TextIO, out: TextIO) -> None:
    """One JSON line out per line in, in order; a bad line gets an ``error`` line."""
    for line in lines:
        if not line.strip():
            continue
        try:
            body = json.loads(line)
            if not isinstance(body, dict):
                raise ValueError("each line must be a JSON object")
            result = clf.classify(body)
            record: dict[str, object] = {
                "difficulty": result.difficulty,
                "score": round(result.score, 6),
                "task": result.task,
                "task_score": round(result.task_score, 6),
            }
        except ValueError as exc:
            record = {"error": str(exc)}
        out.write(json.dumps(record) + "\n")
        out.flush()


def _classify(args: argparse.Namespace) -> int:
    settings = load_settings(RouterSettings, args.config)
    c = settings.classifier
    threshold = c.threshold if args.threshold is None else args.threshold
    clf = TaskClassifier.load(c.weights, threshold, c.policy)
    classify_lines(clf, sys.stdin, sys.stdout)
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="geo-router", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    add_serve_command(sub, SERVICE, help="run the router")
    classify = sub.add_parser("classify", help="JSON lines of request bodies → difficulty")
    classify.add_argument("--config", type=Path, default=None)
    classify.add_argument("--threshold", type=float, default=None)
    classify.set_defaults(func=_classify)
    evaluate = sub.add_parser("eval-classifier", help="accuracy and latency on held-out data")
    eval_classifier.add_arguments(evaluate)
    evaluate.set_defaults(func=eval_classifier.run)
    return run_command("geo-router", parser, argv)


if __name__ == "__main__":
    sys.exit(main())
