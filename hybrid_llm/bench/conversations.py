"""Conversation workloads: what real chat traffic looks like to a router.

A :class:`Conversation` is one client's session: the messages it starts with
(a system prompt, a pasted document, a given history) and the user turns it
sends one after another, each after the previous answer arrived, with that
answer appended to the history, as a chat client does. Built-in workloads
(``--workload``):

- ``customer-service``: one fixed ~450-token store-assistant system prompt and
  a short question (the same prompt every time: prefix caches matter);
- ``chat``: multi-turn conversations of 3-4 user turns, history growing;
- ``long-context``: a ~600-token document (one of three) and a short question
  about it;
- ``mixed``: the router's labelled difficulty set (``geo_router/data``), one
  conversation per example, simple and hard as labelled (~40% hard);
- ``realistic`` (the default): customer service 40%, chat 25%, mixed 25%,
  long context 10%.

``--dataset FILE`` replays a file instead (:mod:`hybrid_llm.bench.datasets`).
"""

from __future__ import annotations

import json
import random
from collections.abc import Sequence
from dataclasses import dataclass, field
from importlib import resources
from typing import Any

__all__ = [
    "BUILTIN",
    "Conversation",
    "ConversationWorkload",
    "builtin_workload",
]


@dataclass(frozen=True)
class Conversation:
    """One session: ``prefix`` messages, then ``turns`` sent one after another."""

    label: str
    prefix: tuple[dict[str, Any], ...]
    turns: tuple[str, ...]
    max_tokens: int | None = None  # None: the workload's


@dataclass
class ConversationWorkload:
    """Draws conversations by weight from named pools; builds chat bodies."""

    model: str
    pools: dict[str, list[Conversation]]
    weights: dict[str, float]
    max_tokens: int = 64
    seed: int = 0
    api: str = "chat"
    _rng: random.Random = field(init=False, repr=False)

    def __post_init__(self) -> None:
        if not self.pools or not any(self.pools.values()):
            raise ValueError("a workload needs at least one conversation")
        self._rng = random.Random(self.seed)

    @property
    def path(self) -> str:
        return "/v1/chat/completions"

    @property
    def labels(self) -> list[str]:
        return sorted(self.pools)

    def conversation(self) -> Conversation:
        names = [n for n in sorted(self.pools) if self.pools[n]]
        name = self._rng.choices(names, weights=[self.weights.get(n, 1.0) for n in names])[0]
        return self._rng.choice(self.pools[name])

    def request_body(
        self, messages: Sequence[dict[str, Any]], max_tokens: int | None
    ) -> dict[str, Any]:
        return {
            "model": self.model,
            "messages": list(messages),
            "max_tokens": max_tokens or self.max_tokens,
            "stream": True,
            "stream_options": {"include_usage": True},
            "temperature": 0.0,
        }


# ~450 tokens of a store's assistant instructions (the customer-service workload).
SUPPORT_SYSTEM = """You are Mia, the virtual assistant of Lakeside Home & Garden, an online and in-store retailer of furniture, garden tools and home decor. Follow these rules in every reply.
1. Be friendly and concise: two to four sentences unless the customer asks for detail.
2. Store hours: Monday to Saturday 9:00-20:00, Sunday 10:00-18:00. Holiday hours are posted on the website one week ahead.
3. Returns: unused items can be returned within 30 days with a receipt or order number. Furniture returns need a pickup appointment; a $25 pickup fee applies unless the item was damaged.
4. Shipping: standard delivery takes 3-5 business days and is free over $75. Express (1-2 days) costs $14.99. We ship to the US and Canada only.
5. Orders: customers can track orders on the website with their order number and email. Never ask for full card numbers or passwords.
6. Payment: we accept Visa, Mastercard, American Express, PayPal and gift cards. Financing is available for orders over $500 through our partner.
7. If a customer is upset, apologize once, then focus on a concrete next step.
8. Escalate to a human agent when the customer asks for one, mentions a safety issue, or when a refund over $200 is requested. Say: "I'll connect you with a team member now."
9. Do not give legal, medical or financial advice. Do not discuss competitors.
10. Loyalty program: members earn 1 point per dollar; 500 points = $10 off. Sign-up is free in store or online.
11. Price matching: we match identical items from major US retailers within 14 days of purchase.
12. Assembly service is available for $49 per item in most cities; customers book it at checkout.
13. Gift cards never expire and can be used online and in store; lost gift cards can be replaced with the receipt.
Always end with an offer to help further. Answer in the customer's language."""  # noqa: E501

SUPPORT_QUESTIONS = (
    "What are your store hours?", "Do you ship to Canada?", "How much is express shipping?",
    "Can I return a chair I bought last week?", "Where can I track my order?",
    "Do you accept PayPal?", "Is there a fee for furniture pickup?",
    "How do I join the loyalty program?", "Are you open on Sunday?",
    "How long does standard delivery take?", "Can I pay with a gift card?",
    "What's your return policy?", "Do you price match?", "Can someone assemble my table?",
    "Is shipping free?", "Can I cancel my order?", "My package is late, what should I do?",
    "Do gift cards expire?", "I would like to talk to a person please.",
    "What time do you close today?",
    "你们周日几点关门？", "可以退货吗？",
)  # fmt: skip

CHATS = (
    ("What's a good itinerary for 3 days in Rome?", "And for Florence?", "Which is cheaper?",
     "thanks!"),
    ("Give me a simple recipe for pancakes.", "Can I make them without eggs?",
     "How many does that make?"),
    ("Recommend a sci-fi novel for a beginner.", "Anything shorter?", "Who wrote it?",
     "Great, thanks"),
    ("What should I pack for a week in Iceland in March?", "Do I need crampons?",
     "What about the Blue Lagoon, is it worth it?"),
    ("Explain what a B-tree index is.", "So it's like a phone book?",
     "When would a hash index be better?"),
    ("我想学做红烧肉，怎么做？", "没有冰糖可以吗？", "要炖多久？", "谢谢！"),
    ("推荐几部适合周末看的电影", "有没有喜剧？", "哪部最短？"),
    ("Help me write a birthday message for my sister.", "Make it funnier.", "Shorter please."),
)  # fmt: skip

_DOC_PARTS = (
    "Section {n}. {topic}: The Aurora 300 purifier must be placed at least 30 cm from walls. "
    "The fan has five speeds; speed 1 is quieter than 25 dB and speed 5 moves 300 cubic metres "
    "an hour. Replace the HEPA filter every 6 months or when the indicator turns red; the "
    "carbon pre-filter can be vacuumed monthly. Warranty is two years, extended to five when "
    "the product is registered within 30 days. Do not use near open flames or in bathrooms. "
)
DOCUMENTS = (
    ("user manual", "placement", "maintenance", "filters", "warranty", "safety", "troubleshooting"),
    ("employee handbook", "working hours", "leave", "expenses", "travel", "equipment", "conduct"),
    ("rental agreement", "rent", "deposit", "repairs", "pets", "noise", "termination"),
)
DOC_QUESTIONS = (
    "How often should the filter be replaced?", "How long is the warranty?",
    "Summarize section 2 in one sentence.", "What is the quietest speed?",
    "Can I use it in the bathroom?", "How far from the wall should it be?",
)  # fmt: skip


def _document(kind: Sequence[str]) -> str:
    title, *topics = kind
    body = "".join(_DOC_PARTS.format(n=i + 1, topic=t) for i, t in enumerate(topics))
    return f"{title.upper()}\n{body}"


def customer_service() -> list[Conversation]:
    system = ({"role": "system", "content": SUPPORT_SYSTEM},)
    return [Conversation("customer-service", system, (q,)) for q in SUPPORT_QUESTIONS]


def chat() -> list[Conversation]:
    return [Conversation("chat", (), turns) for turns in CHATS]


def long_context() -> list[Conversation]:
    out = []
    for kind in DOCUMENTS:
        doc = _document(kind)
        for q in DOC_QUESTIONS:
            out.append(Conversation("long-context", (), (f"{doc}\n\n{q}",)))
    return out


def mixed() -> list[Conversation]:
    """Every labelled example of the router's difficulty set, as it is."""
    text = resources.files("geo_router").joinpath("data/difficulty.jsonl").read_text("utf-8")
    out = []
    for line in text.splitlines():
        if not line.strip():
            continue
        messages = json.loads(line)["messages"]
        last = messages[-1]
        if last.get("role") == "user" and isinstance(last.get("content"), str):
            out.append(Conversation("mixed", tuple(messages[:-1]), (last["content"],)))
    return out


BUILTIN: dict[str, dict[str, float]] = {
    "customer-service": {"customer-service": 1.0},
    "chat": {"chat": 1.0},
    "long-context": {"long-context": 1.0},
    "mixed": {"mixed": 1.0},
    "realistic": {"customer-service": 0.4, "chat": 0.25, "mixed": 0.25, "long-context": 0.1},
}
_POOLS = {
    "customer-service": customer_service,
    "chat": chat,
    "long-context": long_context,
    "mixed": mixed,
}


def builtin_workload(
    name: str, model: str, *, max_tokens: int = 64, seed: int = 0
) -> ConversationWorkload:
    """One of :data:`BUILTIN` by name."""
    if name not in BUILTIN:
        raise ValueError(f"unknown workload {name!r}; built in: {', '.join(sorted(BUILTIN))}")
    weights = BUILTIN[name]
    pools = {pool: _POOLS[pool]() for pool in weights}
    return ConversationWorkload(model, pools, weights, max_tokens=max_tokens, seed=seed)
