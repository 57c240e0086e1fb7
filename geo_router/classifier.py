"""Difficulty classification (``simple | hard``) in tens of microseconds, Chinese and English.

A logistic model over a handful of features that compiled regular expressions
compute in C: length (words for English, characters for Chinese), keywords
that signal reasoning, code or math, keywords that signal chit-chat and
lookups, structure (numbered parts, several requirements), and conversation
depth. The weights are fitted on the training split of the bundled labelled
set (``geo_router/train_classifier.py``) and stored as JSON next to it;
``geo_router/eval_classifier.py`` reports accuracy on the held-out split.
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

__all__ = [
    "FEATURES",
    "Classification",
    "DifficultyClassifier",
    "features",
    "request_text",
]

Difficulty = Literal["simple", "hard"]

_HARD_EN = re.compile(
    r"\b(?:prove|proof|derive|derivation|analy[sz]e|analysis|compare|contrast|trade-?offs?|"
    r"design|architect\w*|implement\w*|algorithm\w*|optimi[sz]\w*|refactor\w*|debug\w*|"
    r"complexity|step[- ]by[- ]step|in detail|detailed|comprehensive|essay|strateg\w+|"
    r"evaluate|critique|theorem|integral|differential|equations?|simulat\w+|function|class|"
    r"program|script|code|regex|sql|concurren\w+|distributed|pros and cons|implications?|"
    r"calculate|estimate|why does|why do|how would|plan|migrat\w+|benchmark\w*|schema|"
    r"api|latency|throughput|scal\w+|model|probabilit\w+|statistic\w*|recursive|"
    r"explain how|walk me through|outline|argue|justify|review)\b",
    re.IGNORECASE,
)
_SIMPLE_EN = re.compile(
    r"\b(?:hi|hello|hey|thanks|thank you|good (?:morning|night|evening)|bye|capital of|"
    r"translate|define|meaning of|synonym|antonym|spell|what time|weather|how do you say|"
    r"who (?:is|was|wrote|painted|invented)|when (?:is|was|did)|what is|what's|what color|"
    r"how many|how old|tell me a joke|joke|name (?:a|one|three)|yes or no|true or false|"
    r"convert|how far|where is|which is|recommend a|fun fact|plural of|opposite of)\b",
    re.IGNORECASE,
)
_HARD_ZH = re.compile(
    r"证明|推导|分析|比较|对比|设计|架构|实现|算法|优化|重构|调试|复杂度|为什么|详细|深入|"
    r"步骤|论述|评估|策略|方案|代码|编写|程序|函数|定理|积分|微分|方程|模拟|分布式|并发|"
    r"权衡|利弊|影响|论文|计算|推理|规划|原理|机制|系统|模型|数据库|性能|概率|统计|递归|"
    r"阐述|探讨|解释一下.{0,6}如何|如何.{0,8}(?:实现|设计|优化)|写一[篇个段]|制定|总结|评价"
)
_SIMPLE_ZH = re.compile(
    r"你好|您好|谢谢|早上好|晚安|再见|翻译|什么意思|首都|天气|几点|是谁|哪一年|哪年|笑话|"
    r"同义词|反义词|怎么说|是不是|多少|几个|哪里|在哪|什么颜色|多大|多高|多远|叫什么|"
    r"推荐一[个本部首]|是什么"
)
_CODE = re.compile(r"```|\bdef |\bfunction\b|=>|#include|\bSELECT\b|\{\s*$|;\s*$", re.M)
_MATH = re.compile(r"[∫∑√≤≥≠π]|\\frac|\\int|\^\d|\d\s*[+\-*/×÷=]\s*\d|[xyn]\s*=|f\(x\)")
_PARTS = re.compile(r"(?:^|\n)\s*(?:\d+[.)、]|[-*•]\s)|；|;|\bthen\b|\balso\b|并且|同时|然后|以及")
_WORDS = re.compile(r"[A-Za-z0-9]+")
_CJK = re.compile(r"[\u3400-\u9fff]")

FEATURES: tuple[str, ...] = (
    "bias",
    "log_length",
    "hard_keywords",
    "simple_keywords",
    "code",
    "math",
    "parts",
    "turns",
    "context",
    "cjk_share",
)


def features(text: str, turns: int = 1, context_chars: int = 0) -> list[float]:
    """The feature vector of ``text`` (the last user turn), in :data:`FEATURES` order."""
    words = len(_WORDS.findall(text))
    cjk = len(_CJK.findall(text))
    # About 1.5 Chinese characters carry what one English word does.
    units = words + cjk / 1.5
    hard = len(_HARD_EN.findall(text)) + len(_HARD_ZH.findall(text))
    simple = len(_SIMPLE_EN.findall(text)) + len(_SIMPLE_ZH.findall(text))
    return [
        1.0,
        math.log1p(units),
        min(hard, 4) / 2.0,
        min(simple, 3) / 2.0,
        1.0 if _CODE.search(text) else 0.0,
        1.0 if _MATH.search(text) else 0.0,
        min(len(_PARTS.findall(text)), 6) / 3.0,
        min(turns - 1, 8) / 4.0,
        math.log1p(context_chars / 1000.0),
        cjk / max(1, cjk + words),
    ]


def request_text(body: Mapping[str, Any]) -> tuple[str, int, int]:
    """(last user text, number of turns, characters before it) of a chat or completion body."""
    messages = body.get("messages")
    if isinstance(messages, Sequence) and not isinstance(messages, str):
        texts = [_content_text(m.get("content")) for m in messages if isinstance(m, Mapping)]
        last = ""
        for m in reversed(messages):
            if isinstance(m, Mapping) and m.get("role") == "user":
                last = _content_text(m.get("content"))
                break
        else:
            last = texts[-1] if texts else ""
        turns = sum(1 for m in messages if isinstance(m, Mapping) and m.get("role") == "user")
        total = sum(len(t) for t in texts)
        return last, max(turns, 1), max(0, total - len(last))
    prompt = body.get("prompt")
    if isinstance(prompt, list):
        prompt = prompt[0] if prompt and isinstance(prompt[0], str) else ""
    return (prompt if isinstance(prompt, str) else ""), 1, 0


def _content_text(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(p.get("text", "") for p in content if isinstance(p, Mapping) and "text" in p)
    return ""


@dataclass(frozen=True, slots=True)
class Classification:
    difficulty: Difficulty
    score: float


class DifficultyClassifier:
    """``score`` is the model's probability that the request is hard."""

    def __init__(
        self, weights: Sequence[float], threshold: float = 0.5, max_chars: int = 4000
    ) -> None:
        if len(weights) != len(FEATURES):
            raise ValueError(f"expected {len(FEATURES)} weights, got {len(weights)}")
        self.weights = list(weights)
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
        weights = [float(data["weights"][name]) for name in FEATURES]
        return cls(weights, threshold, max_chars)

    def score_text(self, text: str, turns: int = 1, context_chars: int = 0) -> float:
        x = features(text[-self.max_chars :], turns, context_chars)
        z = sum(w * v for w, v in zip(self.weights, x, strict=True))
        return 1.0 / (1.0 + math.exp(-max(-30.0, min(30.0, z))))

    def classify(self, body: Mapping[str, Any]) -> Classification:
        text, turns, context = request_text(body)
        score = self.score_text(text, turns, context)
        return Classification("hard" if score >= self.threshold else "simple", score)
