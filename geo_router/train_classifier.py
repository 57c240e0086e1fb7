"""Fit the classifier's logistic weights on the train split of the labelled set.

    python -m geo_router.train_classifier [--out geo_router/data/classifier_weights.json]

Plain batch gradient descent with a little L2; the held-out split is never
read, so ``eval_classifier`` reports an honest figure.
"""

from __future__ import annotations

import argparse
import json
import math
from collections.abc import Sequence
from pathlib import Path

from geo_router.classifier import FEATURES, features, request_text
from geo_router.eval_classifier import load_examples

__all__ = ["fit", "main"]


def fit(
    rows: Sequence[Sequence[float]], labels: Sequence[int], epochs: int = 3000, lr: float = 0.5
) -> list[float]:
    w = [0.0] * len(FEATURES)
    n = len(rows)
    l2 = 1e-3
    for _ in range(epochs):
        grad = [0.0] * len(w)
        for x, y in zip(rows, labels, strict=True):
            z = sum(wi * xi for wi, xi in zip(w, x, strict=True))
            err = 1.0 / (1.0 + math.exp(-max(-30.0, min(30.0, z)))) - y
            for i, xi in enumerate(x):
                grad[i] += err * xi
        for i in range(len(w)):
            w[i] -= lr * (grad[i] / n + (l2 * w[i] if i else 0.0))
    return w


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument(
        "--out", type=Path, default=Path(__file__).parent / "data" / "classifier_weights.json"
    )
    args = parser.parse_args(argv)
    train = [e for e in load_examples() if e.split == "train"]
    rows = []
    for ex in train:
        text, turns, context = request_text({"messages": [{"role": "user", "content": ex.text}]})
        rows.append(features(text, turns, context))
    w = fit(rows, [int(e.label == "hard") for e in train])
    data = {"features": list(FEATURES), "weights": dict(zip(FEATURES, w, strict=True))}
    data["trained_on"] = f"{len(train)} train-split examples of data/difficulty.jsonl"
    args.out.write_text(json.dumps(data, indent=2) + "\n", encoding="utf-8")
    print(json.dumps(data, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
