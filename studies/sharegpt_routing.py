"""Where the task policy sends real chat: the first 60 ShareGPT conversations, offline.

    .venv/bin/python -m studies.sharegpt_routing --cache DIR [--count 60] [--write FILE]

The conversations are ShareGPT V3's first ones (never trained on: the
training set skips them, ``studies.task_data.SHAREGPT_RESERVED``), each cut at
its second user turn when it has one (a follow-up with its history). Prints
the share the policy sends to the center at the configured dial, the task
types it saw, and the same at other thresholds. ``--write`` saves them as
OpenAI message lists (JSON lines) for ``hybrid-llm bench --dataset``.
"""

from __future__ import annotations

import argparse
import json
from collections import Counter
from pathlib import Path

from geo_router.classifier import TaskClassifier
from studies.task_data import sharegpt

__all__ = ["main"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--cache", type=Path, required=True, help="folder of downloaded wheels")
    parser.add_argument("--count", type=int, default=60)
    parser.add_argument("--threshold", type=float, default=0.5)
    parser.add_argument("--write", type=Path, default=None)
    args = parser.parse_args()
    conversations = sharegpt(args.cache, args.count)
    bodies = [{"model": "auto", "messages": m} for m in conversations]
    if args.write is not None:
        with args.write.open("w", encoding="utf-8") as out:
            for m in conversations:
                out.write(json.dumps({"messages": m}) + "\n")  # ASCII: no U+2028 in a line
    for threshold in sorted({args.threshold, 0.3, 0.4, 0.6}):
        clf = TaskClassifier.load(threshold=threshold)
        results = [clf.classify(b) for b in bodies]
        center = sum(r.difficulty == "hard" for r in results)
        print(f"threshold {threshold}: {center}/{len(bodies)} to the center")
        if threshold == args.threshold:
            tasks = Counter(r.task for r in results)
            to_center = Counter(r.task for r in results if r.difficulty == "hard")
            for task, n in tasks.most_common():
                print(f"  {task:<14}{n:>3}  ({to_center[task]} to the center)")


if __name__ == "__main__":
    main()
