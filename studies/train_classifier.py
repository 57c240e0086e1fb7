"""Fit the router's task-type model (``geo_router.tasks``) on public sources.

    .venv/bin/python -m studies.train_classifier --cache DIR [--out FILE]

(``--out`` defaults to ``geo_router/data/task_weights.json``.)

Rows come from :mod:`studies.task_data` (MT-Bench is held out whole and never
seen here; our own cases train on their train split only). A softmax
regression over the features of :func:`geo_router.tasks.features`, fitted
with numpy by full-batch Adam, L2-regularised, each task's rows weighted by
1/(its count): every task weighs the same, so a big source does not drown the small ones.
Features seen fewer than three times are dropped; the weights are stored as int8
with one scale per task.
"""

from __future__ import annotations

import argparse
import base64
import json
from pathlib import Path

import numpy as np

from geo_router.reading import read
from geo_router.tasks import TASKS, TaskModel, features
from studies.task_data import Row, load_training

__all__ = ["fit", "main"]


def _matrix(rows: list[Row], index: dict[str, int]) -> np.ndarray:
    x = np.zeros((len(rows), len(index)), dtype=np.float32)
    for n, row in enumerate(rows):
        text, flags = features(read({"messages": row["messages"]}))
        scale = 1.0 / np.sqrt(len(text)) if text else 0.0
        for f in text:
            if f in index:
                x[n, index[f]] = scale
        for f in flags:
            if f in index:
                x[n, index[f]] = 1.0
    return x


def fit(rows: list[Row], epochs: int = 150, l2: float = 1e-4) -> tuple[list[str], np.ndarray]:
    counts: dict[str, int] = {}
    for row in rows:
        text, flags = features(read({"messages": row["messages"]}))
        for f in (*text, *flags):
            counts[f] = counts.get(f, 0) + 1
    vocab = sorted(f for f, c in counts.items() if c >= 3 or f.startswith(("x:", "r:")))
    index = {f: i for i, f in enumerate(vocab)}
    x = _matrix(rows, index)
    y = np.array([TASKS.index(r["task"]) for r in rows])
    per_task = np.bincount(y, minlength=len(TASKS)).astype(np.float32)
    sample = 1.0 / np.maximum(per_task[y], 1.0)
    sample /= sample.sum()
    onehot = np.eye(len(TASKS), dtype=np.float32)[y]
    w = np.zeros((len(vocab), len(TASKS)), dtype=np.float32)
    m = np.zeros_like(w)
    v = np.zeros_like(w)
    lr, b1, b2 = 0.1, 0.9, 0.999
    for step in range(1, epochs + 1):
        z = x @ w
        z -= z.max(axis=1, keepdims=True)
        p = np.exp(z)
        p /= p.sum(axis=1, keepdims=True)
        grad = x.T @ ((p - onehot) * sample[:, None]) + l2 * w
        m = b1 * m + (1 - b1) * grad
        v = b2 * v + (1 - b2) * grad * grad
        w -= lr * (m / (1 - b1**step)) / (np.sqrt(v / (1 - b2**step)) + 1e-8)
    return vocab, w


def export(vocab: list[str], w: np.ndarray) -> dict[str, object]:
    blobs, scales = [], []
    for k in range(len(TASKS)):
        col = w[:, k]
        scale = float(np.abs(col).max() / 127.0) or 1.0
        q = np.clip(np.round(col / scale), -127, 127).astype(np.int8)
        blobs.append(base64.b64encode(q.tobytes()).decode("ascii"))
        scales.append(scale)
    return {"tasks": list(TASKS), "vocab": vocab, "weights": blobs, "scales": scales}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--cache", type=Path, required=True, help="folder of downloaded wheels")
    parser.add_argument("--own", type=Path, default=Path("geo_router/data/difficulty.jsonl"))
    parser.add_argument("--out", type=Path, default=Path("geo_router/data/task_weights.json"))
    parser.add_argument("--epochs", type=int, default=150)
    args = parser.parse_args()
    rows = [r for r in load_training(args.cache, args.own) if r["split"] == "train"]
    vocab, w = fit(rows, args.epochs)
    args.out.write_text(json.dumps(export(vocab, w)), encoding="utf-8")
    model = TaskModel.load(args.out)
    right = sum(
        max((p := model.probabilities({"messages": r["messages"]})), key=p.__getitem__) == r["task"]
        for r in rows
    )
    print(
        f"{len(rows)} training rows, {len(vocab)} features; train accuracy {right / len(rows):.3f}"
    )


if __name__ == "__main__":
    main()
