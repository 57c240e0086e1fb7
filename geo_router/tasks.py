"""Task type of the latest user turn, read in its conversation: a linear model.

Twelve task types, chosen because published per-category results show they
differ in how much worse a 7B-class model answers them than a large one
(``docs/router.md`` has the figures and the policy built on them):

    chat, lookup, extraction, translation, summarization, writing, roleplay,
    explanation, math, reasoning, code, code_review

Features of a request (:func:`features`), read through
:func:`geo_router.reading.read` (the ask of the latest user turn without
pasted material, and figures of its context):

- words and word bigrams of the ask (lower case, digits as 0), its first word,
  and Chinese characters and character bigrams (Chinese has no spaces);
- words of the previous user turn's ask (``p:``), so "now do it for n=5"
  after a maths question reads as maths;
- which of the documented keyword rules (:data:`RULES`) match the ask;
- context flags: a system prompt, a history, pasted code, a long context, an
  arithmetic pattern, a question mark.

Text features count 1/sqrt(their number) each, flags 1 each. The softmax
model's weights are fitted by ``studies/train_classifier.py`` on public
sources (``studies/task_data.py``) and shipped as
``data/task_weights.json`` (vocabulary, int8 weights with one scale per task).
Inference is plain Python: a dict look-up per feature and one C-level sum
per task, tens of microseconds.
"""

from __future__ import annotations

import base64
import itertools
import json
import math
import re
from array import array
from collections.abc import Mapping, Sequence
from importlib import resources
from pathlib import Path
from typing import Any

from geo_router.reading import Reading, read

__all__ = ["RULES", "TASKS", "TaskModel", "features", "rule_label", "rule_match"]

TASKS: tuple[str, ...] = (
    "chat",
    "lookup",
    "extraction",
    "translation",
    "summarization",
    "writing",
    "roleplay",
    "explanation",
    "math",
    "reasoning",
    "code",
    "code_review",
)

_WORD = re.compile(r"[a-z0-9']+")
_CJK_RUN = re.compile(r"[\u3400-\u9fff]+")
_DIGITS = re.compile(r"\d+")
_ARITH = re.compile(r"\d\s*[-+*/×÷^=]\s*\d|[∫∑√≤≥≠π]|\\frac")
_CODE = re.compile(r"\bdef |\bfunction\b|=>|#include|\bSELECT\b|;\s*$", re.M)
MAX_ASK_CHARS = 2000

# rule_label: the first rule whose pattern matches the latest user turn wins.
RULES: tuple[tuple[str, re.Pattern[str]], ...] = tuple(
    # Matched against lower-cased text (cheaper than re.I, the same for these patterns).
    (task, re.compile("|".join(parts)))
    for task, parts in (
        ("translation", (r"\btranslat", r"how do you say", "翻译|译成|怎么说")),
        ("summarization", (r"\bsummar|\btl;?dr|\bkey points\b", "总结|概括|摘要")),
        (
            "roleplay",
            (
                r"\bpretend\b|\bact as\b|\brole-?play",
                r"\byou are (a|an) (?!assistant)",
                "扮演|假装",
            ),
        ),
        (
            "code_review",
            (
                r"\b(review|explain|debug|fix|what does) (this|the|my) "
                r"(code|function|query|script|snippet)",
                r"```",
                r"这段代码|代码.*(错|问题|解释)",
            ),
        ),
        (
            "code",
            (
                r"\b(python|javascript|java|c\+\+|rust|golang|sql|regex|bash|function|class"
                r"|script|program|algorithm|api|implement)\b",
                "代码|函数|编写|程序|算法|脚本",
            ),
        ),
        (
            "math",
            (
                r"\d\s*[-+*/×÷^=]\s*\d",
                r"\b(solve|integral|derivative|equation|probability|prove|theorem|calculate"
                r"|compute)\b",
                "计算|方程|积分|概率|证明|求解|等于多少",
            ),
        ),
        (
            "reasoning",
            (
                r"\b(puzzle|riddle|logic|deduce|if .* then|which of|trade-?offs?|pros and cons"
                r"|compare|analy[sz]e|strategy|plan)\b",
                "推理|逻辑|比较|分析|权衡|利弊|策略|方案",
            ),
        ),
        (
            "extraction",
            (
                r"\b(extract|list all|parse|format (it|this|as)|json|csv|table|fill in"
                r"|which city|order number|what is my)\b",
                "提取|列出|格式|表格|订单号",
            ),
        ),
        (
            "writing",
            (
                r"\b(write|draft|compose|essay|poem|story|blog|email|letter|slogan|rewrite"
                r"|paraphrase|cover letter)\b",
                "写一|写个|作文|诗|故事|邮件|文案|改写|润色",
            ),
        ),
        (
            "chat",
            (
                r"^\W*(hi|hello|hey|thanks|thank you|good (morning|night|evening)|bye|ok(ay)?"
                r"|how are you)\b",
                r"^\W*(你好|您好|谢谢|早上好|晚安|再见|好的)",
            ),
        ),
        (
            "explanation",
            (
                r"\b(why|how does|how do|how is|explain|what causes|what makes|describe"
                r"|difference between)\b",
                "为什么|怎么工作|原理|解释|介绍|区别",
            ),
        ),
    )
)


def rule_match(text: str) -> str | None:
    """The first rule of :data:`RULES` that matches ``text``, if any."""
    head = text[:2000].lower()
    for task, pattern in RULES:
        if pattern.search(head):
            return task
    return None


def rule_label(text: str) -> str:
    """Task type of a prompt with no category of its own: the first matching rule
    (:data:`RULES`, in the order translation, summarisation, roleplay, code
    review, code, math, reasoning, extraction, writing, chit-chat, explanation);
    no match is a ``lookup`` when short (under 200 characters), else ``writing``."""
    return rule_match(text) or ("lookup" if len(text) < 200 else "writing")


def features(r: Reading) -> tuple[list[str], list[str]]:
    """(text features of the ask, context flags) of a reading."""
    ask = r.ask[:MAX_ASK_CHARS]
    low = _DIGITS.sub("0", ask.lower())
    words = _WORD.findall(low)
    text: set[str] = {"w:" + w for w in words}
    text.update("b:" + a + "_" + b for a, b in itertools.pairwise(words))
    if words:
        text.add("f:" + words[0])
    if not ask.isascii():
        for run in _CJK_RUN.findall(ask):
            text.update("z:" + ch for ch in run)
            text.update("y:" + run[i : i + 2] for i in range(len(run) - 1))
    if r.prior:
        prior = _DIGITS.sub("0", r.prior[:MAX_ASK_CHARS].lower())
        text.update("p:" + w for w in _WORD.findall(prior))
        for run in _CJK_RUN.findall(r.prior[:MAX_ASK_CHARS]):
            text.update("q:" + run[i : i + 2] for i in range(len(run) - 1))
    flags = ["x:bias"]
    if r.has_system:
        flags.append("x:system")
    if r.turns > 1:
        flags.append("x:history")
    if r.pasted_code or _CODE.search(ask):
        flags.append("x:code")
    if r.context_chars > 2000:
        flags.append("x:long")
    if _ARITH.search(ask):
        flags.append("x:arith")
    if ask.rstrip().endswith(("?", "？")):
        flags.append("x:question")
    lowered = ask.lower()
    flags.extend("r:" + task for task, pattern in RULES if pattern.search(lowered))
    if len(words) + len(ask) // 3 * (not ask.isascii()) <= 4:
        flags.append("x:short")
    return list(text), flags


class TaskModel:
    """Probabilities of each task type in :data:`TASKS` for a request."""

    def __init__(self, vocab: Sequence[str], weights: Sequence[Sequence[float]]) -> None:
        if len(weights) != len(TASKS) or any(len(w) != len(vocab) for w in weights):
            raise ValueError(f"expected {len(TASKS)} rows of {len(vocab)} weights")
        self.index = {f: i for i, f in enumerate(vocab)}
        self.weights = [list(w) for w in weights]

    @classmethod
    def load(cls, path: Path | None = None) -> TaskModel:
        """Weights from ``path``, or the bundled ``data/task_weights.json``."""
        if path is None:
            ref = resources.files("geo_router").joinpath("data/task_weights.json")
            data = json.loads(ref.read_text(encoding="utf-8"))
        else:
            data = json.loads(Path(path).read_text(encoding="utf-8"))
        try:
            if list(data["tasks"]) != list(TASKS):
                raise ValueError(f"tasks {data['tasks']} are not {list(TASKS)}")
            vocab = [str(v) for v in data["vocab"]]
            rows = []
            for blob, scale in zip(data["weights"], data["scales"], strict=True):
                q = array("b", base64.b64decode(blob))
                rows.append([x * float(scale) for x in q])
        except (KeyError, TypeError, ValueError) as exc:
            raise ValueError(f"task weights {path or 'bundled'}: {exc!r}") from None
        return cls(vocab, rows)

    def probabilities(self, body: Mapping[str, Any]) -> dict[str, float]:
        return self.probabilities_of(read(body))

    def probabilities_of(self, r: Reading) -> dict[str, float]:
        text, flags = features(r)
        get = self.index.get
        ids = [i for i in map(get, text) if i is not None]
        fids = [i for i in map(get, flags) if i is not None]
        scale = 1.0 / math.sqrt(len(text)) if text else 0.0
        logits = [
            scale * sum(map(w.__getitem__, ids)) + sum(map(w.__getitem__, fids))
            for w in self.weights
        ]
        top = max(logits)
        exps = [math.exp(z - top) for z in logits]
        total = sum(exps)
        return {t: e / total for t, e in zip(TASKS, exps, strict=True)}
