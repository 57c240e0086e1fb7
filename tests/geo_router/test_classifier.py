from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from geo_router.classifier import TaskClassifier
from geo_router.eval_classifier import evaluate, load_eval, load_own
from geo_router.policy import PolicySettings
from geo_router.tasks import TASKS
from hybrid_llm.local.servers import REPO


@pytest.fixture(scope="module")
def clf() -> TaskClassifier:
    return TaskClassifier.load()


def _user(text: str) -> dict[str, list[dict[str, str]]]:
    return {"messages": [{"role": "user", "content": text}]}


@pytest.mark.parametrize(
    ("text", "task", "difficulty"),
    [
        ("Hi! How are you?", "chat", "simple"),
        ("你好，今天天气怎么样？", "chat", "simple"),
        ("What is the capital of Japan?", "lookup", "simple"),
        ("Write a short poem about autumn.", "writing", "simple"),
        ('Translate "good morning" into French.', "translation", "simple"),
        ("Write a Python function that merges two sorted lists.", "code", "hard"),
        ("请用 Python 实现一个线程安全的 LRU 缓存，并分析时间复杂度。", "code", "hard"),
        ("Solve for x: 3x + 5 = 20.", "math", "hard"),
    ],
)
def test_obvious_cases_in_both_languages(
    clf: TaskClassifier, text: str, task: str, difficulty: str
) -> None:
    got = clf.classify(_user(text))
    assert (got.task, got.difficulty) == (task, difficulty)


def test_held_out_source_routes_the_gap_not_the_sound(clf: TaskClassifier) -> None:
    """MT-Bench is never trained on: math, reasoning and code must reach the center
    more often than writing, roleplay and humanities (the inverse of the old router)."""
    held = load_eval()
    assert {r["source"] for r in held} == {"mtbench"}
    assert len(held) == 160
    report = evaluate(clf, held, load_own())
    assert report["held_out"]["by_task"]["all"]["accuracy"] >= 0.35
    center = report["held_out"]["center"]
    hard = center["math/reasoning/coding"]
    soft = center["writing/roleplay/humanities first turns"]
    assert hard["center"] / hard["n"] >= 2 * soft["center"] / soft["n"]
    assert soft["center"] / soft["n"] <= 0.2
    own = report["own"]["by_lang"]
    assert own["en"]["accuracy"] >= 0.8
    assert own["zh"]["accuracy"] >= 0.8
    curve = report["curve"]
    shares = [p["center_share"] for p in curve]
    assert shares == sorted(shares, reverse=True)  # a higher threshold never sends more
    assert curve[0]["gap_recovered"] == 1.0
    assert curve[-1]["center_share"] == 0.0


SYSTEM = (
    "You are the assistant of a home and garden store. Store hours: Monday to Saturday "
    "9-20, Sunday 10-18. Returns within 30 days with a receipt. Shipping is free over $75. "
) * 8


@pytest.mark.parametrize(
    "messages",
    [
        # Length from a system prompt or a history is not difficulty.
        [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "Open on Sunday?"}],
        [
            {"role": "user", "content": "Design a multi-region active-active database."},
            {"role": "assistant", "content": "Use conflict-free replicated types ... " * 20},
            {"role": "user", "content": "thanks!"},
        ],
    ],
)
def test_the_latest_turn_decides_not_the_request_length(
    clf: TaskClassifier, messages: list[dict[str, str]]
) -> None:
    assert clf.classify({"messages": messages}).difficulty == "simple"


def test_the_dial_moves_the_boundary() -> None:
    body = _user("Explain how rainbows form.")
    score = TaskClassifier.load().classify(body).score
    assert TaskClassifier.load(threshold=score).classify(body).difficulty == "hard"
    assert TaskClassifier.load(threshold=score + 1e-6).classify(body).difficulty == "simple"


def test_the_policy_table_tenants_and_use_cases_win_over_the_dial() -> None:
    code = _user("Write a Python function that merges two sorted lists.")
    policy = PolicySettings(
        tiers={"code": "edge"},
        use_cases={"realtime": "edge", "report": "center"},
        tenants={"acme": {"code": "center"}},
    )
    clf = TaskClassifier.load(policy=policy)
    assert (clf.classify(code).difficulty, clf.classify(code).rule) == ("simple", "table")
    got = clf.classify(code, tenant="acme")
    assert (got.difficulty, got.rule) == ("hard", "tenant")
    hi = _user("hello there")
    assert clf.classify(hi, use_case="report").difficulty == "hard"
    assert clf.classify(code, use_case="realtime").rule == "use-case"


def test_policy_gaps_name_known_task_types() -> None:
    with pytest.raises(ValueError, match="unknown task types"):
        PolicySettings(gaps={"poetry": 0.2})
    assert set(PolicySettings().gaps) == set(TASKS)


def test_classify_cli_answers_each_line_in_order() -> None:
    lines = [
        {"messages": [{"role": "user", "content": "hello"}]},
        {"prompt": "Write a Python function that parses ISO dates and test it."},
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
    assert 0.0 <= records[0]["score"] < 0.5 <= records[1]["score"] <= 1.0
    assert records[1]["task"] == "code"
    assert records[0]["task"] in TASKS
