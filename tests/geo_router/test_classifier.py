from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from geo_router.classifier import DifficultyClassifier
from geo_router.eval_classifier import evaluate, load_examples
from tests.support.servers import REPO


@pytest.fixture(scope="module")
def clf() -> DifficultyClassifier:
    return DifficultyClassifier.load()


@pytest.mark.parametrize(
    ("text", "label"),
    [
        ("Hi! How are you?", "simple"),
        ("你好，今天天气怎么样？", "simple"),
        ("What is the capital of Japan?", "simple"),
        ("Design a sharded key-value store and analyze its failure modes in detail.", "hard"),
        ("请用 Python 实现一个线程安全的 LRU 缓存，并分析时间复杂度。", "hard"),
    ],
)
def test_obvious_cases_in_both_languages(clf: DifficultyClassifier, text: str, label: str) -> None:
    assert clf.classify({"messages": [{"role": "user", "content": text}]}).difficulty == label


def test_held_out_accuracy_in_both_languages(clf: DifficultyClassifier) -> None:
    test = [e for e in load_examples() if e.split == "test"]
    assert {e.lang for e in test} == {"en", "zh"}
    assert len(test) >= 60
    report = evaluate(clf, test)
    accuracy = report["accuracy"]
    assert isinstance(accuracy, dict)
    assert accuracy["en"] >= 0.85
    assert accuracy["zh"] >= 0.85


def test_threshold_moves_the_boundary() -> None:
    body = {"messages": [{"role": "user", "content": "Explain how rainbows form."}]}
    score = DifficultyClassifier.load().classify(body).score
    assert DifficultyClassifier.load(threshold=score).classify(body).difficulty == "hard"
    assert DifficultyClassifier.load(threshold=score + 1e-6).classify(body).difficulty == "simple"


def test_classify_cli_answers_each_line_in_order() -> None:
    lines = [
        {"messages": [{"role": "user", "content": "hello"}]},
        {"prompt": "Prove Fermat's little theorem and derive Euler's generalisation."},
        "not an object",
        {"messages": [{"role": "user", "content": [{"type": "text", "text": "谢谢"}]}]},
    ]
    stdin = "\n".join(json.dumps(x) for x in lines) + "\n"
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    out = subprocess.run(
        [sys.executable, "-m", "geo_router", "classify"],
        input=stdin,
        capture_output=True,
        text=True,
        cwd=REPO,
        env=env,
        timeout=60,
        check=True,
    ).stdout.splitlines()
    records = [json.loads(x) for x in out]
    assert [r.get("difficulty") for r in records] == ["simple", "hard", None, "simple"]
    assert "error" in records[2]
    assert 0.0 <= records[0]["score"] < 0.5 < records[1]["score"] <= 1.0
