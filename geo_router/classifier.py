"""Difficulty (``simple | hard``) of the latest user turn, read in its conversation.

What makes a request hard is what its latest user turn asks, not how long the
request is: a customer-service system prompt, a conversation's history or a
pasted document make a request long, yet "What is my order number?" after
them is a lookup; "How does public-key cryptography work?" is short and
hard; a follow-up ("and for Spain?", "thanks") inherits little from a hard
history. So the classifier reads (:func:`read`):

- the *ask*: the latest user turn without pasted material; when the turn is
  long, its first and last lines (where people put the question: "Summarize
  this: <doc>" or "<doc> Which city is it shipping to?"), fenced code removed;
- the *context*, as a few numbers only: characters of system prompt, history
  and pasted text, whether code was pasted, conversation depth, and how hard
  the previous user turn sounded (weighted lightly by training, not by hand).

A logistic model scores it: character n-grams (2-4) of the ask, each present
n-gram adding its weight scaled by 1/sqrt(n-grams in the ask), plus dense
features (keyword, structure and context figures computed by compiled regular
expressions). Weights are fitted by ``studies/train_classifier.py`` on the
train split of ``geo_router/data/difficulty.jsonl`` and shipped in
``data/classifier_weights.json``; inference is plain Python over a dict (no
model hub, no numpy), tens of microseconds a call.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any, Literal

from geo_router.conversation import turns_of

__all__ = [
    "DENSE",
    "Classification",
    "DifficultyClassifier",
    "Reading",
    "dense_features",
    "ngrams",
    "read",
]

Difficulty = Literal["simple", "hard"]

# Keywords: words by prefix, phrases by substring, Chinese by substring. Plain
# string operations in C; a regular expression with a hundred alternatives
# tried at every position cost ~1 us per character.
_HARD_PREFIXES_EN = (
    "prove", "proof", "derive", "derivation", "analy", "compare", "contrast", "trade",
    "design", "architect", "implement", "algorithm", "optimi", "refactor", "debug",
    "complexity", "essay", "strateg", "evaluat", "critique", "theorem", "integral",
    "differential", "equation", "simulat", "concurren", "distributed", "implication",
    "calculat", "estimat", "migrat", "benchmark", "schema", "latency", "throughput",
    "scalab", "probabil", "statistic", "recursi", "explain", "outline", "justif", "review",
    "diagnos", "generaliz", "generalis", "draft", "rigorous",
)  # fmt: skip
_HARD_PHRASES_EN = (
    "step by step", "step-by-step", "in detail", "pros and cons", "why does", "why do ",
    "why is", "how does", "how do ", "how would", "walk me through", "detailed",
    "comprehensive", "plan a", "what makes", "what causes",
)  # fmt: skip
_SIMPLE_WORDS_EN = frozenset((
    "hi", "hello", "hey", "thanks", "thank", "ok", "okay", "bye", "translate", "define",
    "synonym", "antonym", "spell", "weather", "joke", "convert", "open", "hours", "return",
    "refund", "shipping", "ship", "shipped", "track", "tracking", "password", "fee", "fees",
    "price", "cost", "address", "cancel",
))  # fmt: skip
_SIMPLE_PHRASES_EN = (
    "thank you", "good morning", "good night", "good evening", "capital of", "meaning of",
    "what time", "how do you say", "who is", "who was", "who wrote", "who painted",
    "who invented", "when is", "when was", "when did", "when will", "what is my",
    "what's my", "what color", "how many", "how much", "how old", "how long", "name a ",
    "name one", "name three", "yes or no", "true or false", "how far", "where is",
    "which city", "recommend a", "fun fact", "plural of", "opposite of", "order number",
)  # fmt: skip
_HARD_ZH = (
    "证明", "推导", "分析", "比较", "对比", "设计", "架构", "实现", "算法", "优化", "重构",
    "调试", "复杂度", "为什么", "详细", "深入", "步骤", "论述", "评估", "策略", "方案",
    "编写", "函数", "定理", "积分", "微分", "方程", "模拟", "分布式", "并发", "权衡", "利弊",
    "影响", "论文", "计算", "推理", "规划", "原理", "机制", "概率", "统计", "递归", "诊断",
    "起草", "推广", "阐述", "探讨", "解释", "制定", "总结", "评价", "严谨",
)  # fmt: skip
_HARD_ZH_PATTERNS = re.compile(r"如何.{0,8}(?:实现|设计|优化|保证)|怎么.{0,4}工作|写一[篇个段]")
_SIMPLE_ZH = (
    "你好", "您好", "谢谢", "早上好", "晚安", "再见", "翻译", "什么意思", "首都", "天气",
    "几点", "是谁", "哪一年", "哪年", "笑话", "同义词", "反义词", "怎么说", "是不是", "多少",
    "几个", "哪里", "在哪", "什么颜色", "多大", "多高", "多远", "叫什么", "推荐一", "订单号",
    "退货", "退款", "运费", "包邮", "营业", "物流", "密码", "收费", "好的",
)  # fmt: skip
_WORD = re.compile(r"[a-z0-9']+")
_CODE = re.compile(r"```|\bdef |\bfunction\b|=>|#include|\bSELECT\b|\{\s*$|;\s*$", re.M)
_FENCE = re.compile(r"```.*?(?:```|$)", re.S)
_MATH = re.compile(r"[∫∑√≤≥≠π]|\\frac|\\int|\^\d|\d\s*[+\-*/×÷=]\s*\d|[xyn]\s*=|f\(x\)")
_PARTS = re.compile(r"(?:^|\n)\s*(?:\d+[.)、]|[-*•]\s)|；|;|\bthen\b|\balso\b|并且|同时|然后|以及")
_CJK = re.compile(r"[\u3400-\u9fff]")
_DIGITS = re.compile(r"\d")
_SPACE = re.compile(r"\s+")

# The ask of a long turn: its first and last lines, each cut to this.
LONG_TURN_CHARS = 300
ASK_LINE_CHARS = 160
NGRAM_ORDERS = (2, 3, 4)

DENSE: tuple[str, ...] = (
    "log_length",
    "hard_keywords",
    "simple_keywords",
    "code",
    "math",
    "parts",
    "cjk_share",
    "question",
    "log_context",
    "has_system",
    "turns",
    "pasted_code",
    "prior_hard",
)


@dataclass(frozen=True, slots=True)
class Reading:
    """A request as the classifier sees it."""

    ask: str
    context_chars: int  # system prompt, history and pasted text
    turns: int  # user turns so far, this one included
    has_system: bool
    pasted_code: bool
    prior: str  # the previous user turn's ask ("" when there is none)


def _split_ask(text: str) -> tuple[str, int, bool]:
    """(the ask, characters pasted around it, whether code was pasted)."""
    code = "```" in text
    bare = _FENCE.sub(" ", text) if code else text
    if len(bare) <= LONG_TURN_CHARS:
        return bare.strip(), len(text) - len(bare), code
    lines = [ln.strip() for ln in bare.splitlines() if ln.strip()]
    if len(lines) <= 1:
        ask = bare[:ASK_LINE_CHARS] + " " + bare[-ASK_LINE_CHARS:]
    else:
        ask = lines[0][:ASK_LINE_CHARS] + "\n" + lines[-1][-ASK_LINE_CHARS:]
    return ask, max(0, len(text) - len(ask)), code


def read(body: Mapping[str, Any]) -> Reading:
    """The latest user turn's ask and the figures of its context."""
    turns = turns_of(body)
    users = [i for i, t in enumerate(turns) if t.role == "user"]
    last = users[-1] if users else len(turns) - 1
    text = turns[last].text if turns else ""
    ask, pasted, code = _split_ask(text)
    others = sum(len(t.text) for i, t in enumerate(turns) if i != last)
    prior = _split_ask(turns[users[-2]].text)[0] if len(users) > 1 else ""
    return Reading(
        ask=ask,
        context_chars=others + pasted,
        turns=max(1, len(users)),
        has_system=any(t.role in ("system", "developer") for t in turns),
        pasted_code=code,
        prior=prior,
    )


def _keywords(text: str, cjk: bool) -> tuple[int, int, list[str]]:
    """(hard keyword hits, simple keyword hits, the lower-cased words)."""
    low = text.lower()
    words = _WORD.findall(low)
    hard = sum(1 for w in words if w.startswith(_HARD_PREFIXES_EN))
    hard += sum(1 for p in _HARD_PHRASES_EN if p in low)
    simple = sum(1 for w in words if w in _SIMPLE_WORDS_EN)
    simple += sum(1 for p in _SIMPLE_PHRASES_EN if p in low)
    if cjk:
        hard += sum(text.count(k) for k in _HARD_ZH)
        if "如何" in text or "怎么" in text or "写一" in text:
            hard += len(_HARD_ZH_PATTERNS.findall(text))
        simple += sum(text.count(k) for k in _SIMPLE_ZH)
    return hard, simple, words


def _hardness(text: str) -> int:
    return _keywords(text, not text.isascii())[0] if text else 0


def dense_features(r: Reading) -> list[float]:
    """The dense part of the feature vector, in :data:`DENSE` order."""
    text = r.ask
    cjk = 0 if text.isascii() else len(_CJK.findall(text))
    hard, simple, found = _keywords(text, cjk > 0)
    words = len(found)
    units = words + cjk / 1.5  # about 1.5 Chinese characters carry what one word does
    return [
        math.log1p(units),
        min(hard, 4) / 2.0,
        min(simple, 3) / 2.0,
        1.0 if _CODE.search(text) else 0.0,
        1.0 if _MATH.search(text) else 0.0,
        min(len(_PARTS.findall(text)), 6) / 3.0,
        cjk / max(1, cjk + words),
        1.0 if text.rstrip().endswith(("?", "？")) else 0.0,
        math.log1p(r.context_chars / 1000.0),
        1.0 if r.has_system else 0.0,
        min(r.turns - 1, 8) / 4.0,
        1.0 if r.pasted_code else 0.0,
        min(_hardness(r.prior), 4) / 2.0,
    ]


def ngrams(text: str) -> set[str]:
    """Character n-grams of the normalised ask (lower case, digits as 0, one space)."""
    norm = " " + _SPACE.sub(" ", _DIGITS.sub("0", text.lower())).strip() + " "
    out: set[str] = set()
    for n in NGRAM_ORDERS:
        out.update(norm[i : i + n] for i in range(len(norm) - n + 1))
    return out


@dataclass(frozen=True, slots=True)
class Classification:
    difficulty: Difficulty
    score: float


class DifficultyClassifier:
    """``score`` is the model's probability that the request is hard."""

    def __init__(
        self,
        dense: Sequence[float],
        grams: Mapping[str, float],
        bias: float,
        threshold: float = 0.5,
        max_chars: int = 4000,
    ) -> None:
        if len(dense) != len(DENSE):
            raise ValueError(f"expected {len(DENSE)} dense weights, got {len(dense)}")
        self.dense = list(dense)
        self.grams = dict(grams)
        self.bias = bias
        self.threshold = threshold
        self.max_chars = max_chars

    @classmethod
    def load(
        cls, path: Path | None = None, threshold: float = 0.5, max_chars: int = 4000
    ) -> DifficultyClassifier:
        """Weights from ``path``, or the bundled ``data/classifier_weights.json``."""
        if path is None:
            text = resources.files("geo_router").joinpath("data/classifier_weights.json")
            data = json.loads(text.read_text(encoding="utf-8"))
        else:
            data = json.loads(Path(path).read_text(encoding="utf-8"))
        try:
            dense = [float(data["dense"][name]) for name in DENSE]
            grams = {str(k): float(v) for k, v in data["ngrams"].items()}
            bias = float(data["bias"])
        except (KeyError, TypeError, ValueError) as exc:
            raise ValueError(f"classifier weights {path or 'bundled'}: {exc!r}") from None
        return cls(dense, grams, bias, threshold, max_chars)

    def score_reading(self, r: Reading) -> float:
        z = self.bias + sum(w * x for w, x in zip(self.dense, dense_features(r), strict=True))
        found = ngrams(r.ask[: self.max_chars])
        if found:
            get = self.grams.get
            z += sum(get(g, 0.0) for g in found) / math.sqrt(len(found))
        return 1.0 / (1.0 + math.exp(-max(-30.0, min(30.0, z))))

    def classify(self, body: Mapping[str, Any]) -> Classification:
        score = self.score_reading(read(body))
        return Classification("hard" if score >= self.threshold else "simple", score)
