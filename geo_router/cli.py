"""``geo-router``: serve the router, classify prompts, evaluate the classifier.

geo-router serve --config configs/router.yaml [--host H] [--port P]
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
from servekit.config import ConfigError, load_settings

__all__ = ["classify_lines", "main"]


def _serve(args: argparse.Namespace) -> int:
    from geo_router.app import create_app
    from servekit.serve import run_service
    from servekit.tls import ServerTLSSettings

    settings = load_settings(RouterSettings, args.config, host=args.host, port=args.port)
    app = create_app(settings)
    front: Any = app.app  # the FastAPI app behind the completion endpoints

    def reload() -> ServerTLSSettings | None:
        """SIGHUP: the certificate files of the file as it is now (API keys need a restart)."""
        return load_settings(RouterSettings, args.config, host=args.host, port=args.port).tls

    def drain() -> None:
        front.state.draining = True  # /ready turns 503 while in-flight streams finish

    run_service(
        app,
        host=settings.host,
        port=settings.port,
        on_drain=drain,
        log_level=args.log_level,
        graceful_s=settings.graceful_shutdown_s,
        tls=settings.tls,
        on_reload=reload,
    )
    return 0


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
    serve = sub.add_parser("serve", help="run the router")
    serve.add_argument("--config", type=Path, default=None)
    serve.add_argument("--host", default=None)
    serve.add_argument("--port", type=int, default=None)
    serve.add_argument("--log-level", default="warning")
    serve.set_defaults(func=_serve)
    classify = sub.add_parser("classify", help="JSON lines of request bodies → difficulty")
    classify.add_argument("--config", type=Path, default=None)
    classify.add_argument("--threshold", type=float, default=None)
    classify.set_defaults(func=_classify)
    evaluate = sub.add_parser("eval-classifier", help="accuracy and latency on held-out data")
    eval_classifier.add_arguments(evaluate)
    evaluate.set_defaults(func=eval_classifier.run)
    args = parser.parse_args(argv)
    try:
        code: int = args.func(args)
    except ConfigError as exc:
        print(f"geo-router: {exc}", file=sys.stderr)
        return 2
    return code


if __name__ == "__main__":
    sys.exit(main())
