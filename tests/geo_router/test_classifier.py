from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from geo_router.classifier import DifficultyClassifier
from geo_router.eval_classifier import CATEGORIES, Example, evaluate, load_examples
from hybrid_llm.local.servers import REPO


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


def test_held_out_accuracy_in_both_languages_and_every_category(clf: DifficultyClassifier) -> None:
    test = [e for e in load_examples() if e.split == "test"]
    assert {e.lang for e in test} == {"en", "zh"}
    assert len(test) >= 250
    report = evaluate(clf, test, repeats=1)
    assert report["accuracy"]["en"]["accuracy"] >= 0.85
    assert report["accuracy"]["zh"]["accuracy"] >= 0.85
    for category in CATEGORIES:
        row = report["by_category"][category]["all"]
        assert row["n"] >= 8, category
        assert row["accuracy"] >= 0.7, category


def test_the_split_holds_out_whole_pieces() -> None:
    """No test conversation's latest turn or system prompt is seen in training."""
    examples = load_examples()

    def pieces(e: Example) -> set[str]:
        return {m["content"] for m in e.messages if m["role"] == "system"} | {
            e.messages[-1]["content"]
        }

    train = set().union(*(pieces(e) for e in examples if e.split == "train"))
    test = set().union(*(pieces(e) for e in examples if e.split == "test"))
    assert train.isdisjoint(test)


SYSTEM = (
    "You are the assistant of a home and garden store. Store hours: Monday to Saturday "
    "9-20, Sunday 10-18. Returns within 30 days with a receipt. Shipping is free over $75. "
) * 8
ORDER = "Order NW-55123 confirmed: 2 x desk lamp, shipping to Denver, Colorado, $84.20.\n"


@pytest.mark.parametrize(
    ("messages", "label"),
    [
        # Length from a system prompt, a history or a pasted document is not difficulty.
        ([{"role": "system", "content": SYSTEM}, {"role": "user", "content": "Open on Sunday?"}],
         "simple"),
        ([{"role": "user", "content": ORDER * 4 + "What is my order number?"}], "simple"),
        ([{"role": "user", "content": ORDER * 4 + "Which city is it shipping to?"}], "simple"),
        # Short conceptual questions are hard.
        ([{"role": "user", "content": "How does public-key cryptography work?"}], "hard"),
        ([{"role": "user", "content": "How do vaccines train the immune system?"}], "hard"),
        # A follow-up inherits little from a hard history.
        (
            [
                {"role": "user", "content": "Design a multi-region active-active database."},
                {"role": "assistant", "content": "Use conflict-free replicated types ... " * 20},
                {"role": "user", "content": "thanks!"},
            ],
            "simple",
        ),
    ],
)  # fmt: skip
def test_the_latest_turn_decides_not_the_request_length(
    clf: DifficultyClassifier, messages: list[dict[str, str]], label: str
) -> None:
    assert clf.classify({"messages": messages}).difficulty == label


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
