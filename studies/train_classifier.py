"""Fit the classifier's weights on the train split of the labelled set.

    python -m studies.train_classifier [--out geo_router/data/classifier_weights.json]

Logistic regression with L2 over the classifier's own features
(``geo_router.classifier``: character n-grams of the ask, dense context
figures), full-batch gradient descent with Adam in NumPy (the `tools` extra; the
router's inference needs none). The L2 strength is chosen by 3-fold
cross-validation on the train split; the held-out split is never read, so
``eval_classifier`` reports an honest figure. N-grams seen in fewer than
``--min-count`` train examples get no weight.
"""

from __future__ import annotations

import argparse
import json
import math
import random
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from geo_router.classifier import DENSE, dense_features, ngrams, read
from geo_router.eval_classifier import load_examples

__all__ = ["fit", "main"]


def _matrix(rows: Sequence[tuple[list[float], set[str]]], vocab: dict[str, int]) -> Any:
    import numpy as np

    x = np.zeros((len(rows), len(DENSE) + len(vocab)), dtype=np.float32)
    for i, (dense, grams) in enumerate(rows):
        x[i, : len(DENSE)] = dense
        if grams:
            scale = 1.0 / math.sqrt(len(grams))
            for g in grams:
                j = vocab.get(g)
                if j is not None:
                    x[i, len(DENSE) + j] = scale
    return x


def fit(x: Any, y: Any, l2: float, steps: int = 1500, lr: float = 0.05) -> tuple[Any, float]:
    """Weights and bias minimising mean log loss + ``l2``/2 |w|^2 (Adam)."""
    import numpy as np

    w = np.zeros(x.shape[1], dtype=np.float32)
    y = y.astype(np.float32)
    b = 0.0
    m, v = np.zeros_like(w), np.zeros_like(w)
    mb = vb = 0.0
    n = len(y)
    for t in range(1, steps + 1):
        z = x @ w + b
        p = 1.0 / (1.0 + np.exp(-np.clip(z, -30, 30)))
        err = p - y
        gw = (x.T @ err) / n + l2 * w
        gb = float(err.mean())
        m = 0.9 * m + 0.1 * gw
        v = 0.999 * v + 0.001 * gw * gw
        mb = 0.9 * mb + 0.1 * gb
        vb = 0.999 * vb + 0.001 * gb * gb
        c1, c2 = 1 - 0.9**t, 1 - 0.999**t
        w -= lr * (m / c1) / (np.sqrt(v / c2) + 1e-8)
        b -= lr * (mb / c1) / (math.sqrt(vb / c2) + 1e-8)
    return w, b


def _accuracy(x: Any, y: Any, w: Any, b: float) -> float:
    return float((((x @ w + b) >= 0).astype(float) == y).mean())


def main(argv: Sequence[str] | None = None) -> int:
    import numpy as np

    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument(
        "--out", type=Path, default=Path(__file__).parent / "data" / "classifier_weights.json"
    )
    parser.add_argument("--min-count", type=int, default=2)
    parser.add_argument("--l2", type=float, nargs="*", default=[1e-4, 1e-3, 1e-2])
    args = parser.parse_args(argv)
    train = [e for e in load_examples() if e.split == "train"]
    readings = [read({"messages": e.messages}) for e in train]
    rows = [(dense_features(r), ngrams(r.ask)) for r in readings]
    counts = Counter(g for _, grams in rows for g in grams)
    kept = sorted(g for g, c in counts.items() if c >= args.min_count)
    vocab = {g: i for i, g in enumerate(kept)}
    x = _matrix(rows, vocab)
    print(f"{len(train)} examples, {len(vocab)} n-grams", flush=True)
    y = np.array([1.0 if e.label == "hard" else 0.0 for e in train])
    order = list(range(len(train)))
    random.Random(0).shuffle(order)
    folds = [order[k::3] for k in range(3)]
    best_l2, best_acc = args.l2[0], -1.0
    for l2 in args.l2:
        accs = []
        for fold in folds:
            held = np.zeros(len(train), dtype=bool)
            held[fold] = True
            w, b = fit(x[~held], y[~held], l2, steps=400)
            accs.append(_accuracy(x[held], y[held], w, b))
        acc = sum(accs) / len(accs)
        print(f"l2={l2:g}: 3-fold accuracy {acc:.4f}", flush=True)
        if acc > best_acc:
            best_l2, best_acc = l2, acc
    w, b = fit(x, y, best_l2)
    names = sorted(vocab, key=vocab.__getitem__)
    grams = {
        g: round(float(w[len(DENSE) + i]), 5)
        for i, g in enumerate(names)
        if abs(w[len(DENSE) + i]) >= 1e-3
    }
    data = {
        "bias": round(b, 5),
        "dense": {name: round(float(w[i]), 5) for i, name in enumerate(DENSE)},
        "ngrams": dict(sorted(grams.items())),
        "l2": best_l2,
        "trained_on": f"{len(train)} train-split examples of data/difficulty.jsonl",
        "train_accuracy": round(_accuracy(x, y, w, b), 4),
    }
    args.out.write_text(json.dumps(data, ensure_ascii=False, indent=0) + "\n", encoding="utf-8")
    print(f"l2={best_l2:g}, {len(grams)} n-gram weights, train accuracy {data['train_accuracy']}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
