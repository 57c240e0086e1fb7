"""What the load generator sends: the workload seam, and synthetic length buckets.

A workload (:class:`Source`) hands out conversations
(:class:`~hybrid_llm.bench.conversations.Conversation`) and builds the
request body for each turn; the runner sends the turns. Besides the
conversation workloads (``--workload``, ``--dataset``) there are synthetic
length buckets (``--bucket``), for engine measurements that need a known
prompt length: prompts built from a fixed vocabulary of short common English
words, each about one token for the usual BPE tokenizers, so ``prompt_tokens``
is a close (not exact) target. They are not what users send (a router judges
filler words hard); the server's reported usage is what the report counts.
"""

from __future__ import annotations

import random
import secrets
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal, Protocol

from hybrid_llm.bench.conversations import Conversation

__all__ = ["Bucket", "Source", "Workload", "parse_bucket"]

Api = Literal["chat", "completions"]

_TEXT = (
    "the of and to in is was for on are with as be at by this had not but from or have an they "
    "which one you were all her she there would their we him been has when who will more no if "
    "out so said what up its about than into them can only other new some could time these two "
    "may then do first any my now such like our over man me even most made after also did many "
    "before must through back years where much your way well down should because each just those "
    "people how too little state good very make world still own see men work long get here"
)
_WORDS = tuple(_TEXT.split())


@dataclass(frozen=True)
class Bucket:
    """One prompt/output length class and its share of the traffic."""

    prompt_tokens: int
    output_tokens: int
    weight: float = 1.0

    @property
    def label(self) -> str:
        return f"{self.prompt_tokens}:{self.output_tokens}"


def parse_bucket(text: str) -> Bucket:
    """``PROMPT:OUTPUT[:WEIGHT]`` token counts, e.g. ``128:64`` or ``1024:128:0.2``."""
    parts = text.split(":")
    if len(parts) not in (2, 3):
        raise ValueError(f"bucket {text!r}: expected PROMPT:OUTPUT[:WEIGHT]")
    try:
        prompt, output = int(parts[0]), int(parts[1])
        weight = float(parts[2]) if len(parts) == 3 else 1.0
    except ValueError:
        raise ValueError(f"bucket {text!r}: lengths must be integers, weight a number") from None
    if prompt < 1 or output < 1 or weight <= 0:
        raise ValueError(f"bucket {text!r}: lengths and weight must be positive")
    return Bucket(prompt, output, weight)


class Source(Protocol):
    """What the runner needs of a workload."""

    @property
    def model(self) -> str: ...

    @property
    def api(self) -> str: ...

    @property
    def path(self) -> str: ...

    @property
    def labels(self) -> list[str]: ...

    def conversation(self) -> Conversation: ...

    def request_body(
        self, messages: Sequence[dict[str, Any]], max_tokens: int | None
    ) -> dict[str, Any]: ...


@dataclass
class Workload:
    """Draws request bodies: bucket by weight, a fresh prompt of about its length."""

    model: str
    buckets: list[Bucket]
    api: Api = "chat"
    seed: int = 0
    extra_body: dict[str, Any] | None = None
    # Unique per workload object unless given, so a rerun (same seed) misses the
    # server's prefix cache just like the first run did.
    nonce: str | None = None

    def __post_init__(self) -> None:
        if not self.buckets:
            raise ValueError("a workload needs at least one bucket")
        self._rng = random.Random(self.seed)
        self._serial = 0
        self._nonce = secrets.token_hex(3) if self.nonce is None else self.nonce

    @property
    def path(self) -> str:
        return "/v1/chat/completions" if self.api == "chat" else "/v1/completions"

    @property
    def labels(self) -> list[str]:
        return [b.label for b in self.buckets]

    def conversation(self) -> Conversation:
        """One single-turn conversation of a bucket drawn by weight."""
        bucket, body = self.draw()
        text = body["messages"][-1]["content"] if self.api == "chat" else body["prompt"]
        return Conversation(bucket.label, (), (text,), bucket.output_tokens)

    def request_body(
        self, messages: Sequence[dict[str, Any]], max_tokens: int | None
    ) -> dict[str, Any]:
        body: dict[str, Any] = {
            "model": self.model,
            "max_tokens": max_tokens,
            "stream": True,
            "stream_options": {"include_usage": True},
            "temperature": 0.0,
        }
        if self.api == "chat":
            body["messages"] = list(messages)
        else:
            body["prompt"] = messages[-1]["content"]
        if self.extra_body:
            body.update(self.extra_body)
        return body

    def draw(self) -> tuple[Bucket, dict[str, Any]]:
        bucket = self._rng.choices(self.buckets, weights=[b.weight for b in self.buckets])[0]
        return bucket, self.body(bucket)

    def body(self, bucket: Bucket) -> dict[str, Any]:
        self._serial += 1
        # A unique head defeats prefix caches, so every request pays its prefill.
        words = [f"q{self._nonce}{self._serial}"]
        words += self._rng.choices(_WORDS, k=max(0, bucket.prompt_tokens - 1))
        text = " ".join(words)
        body: dict[str, Any] = {
            "model": self.model,
            "max_tokens": bucket.output_tokens,
            "stream": True,
            "stream_options": {"include_usage": True},
            "temperature": 0.0,
        }
        if self.api == "chat":
            body["messages"] = [{"role": "user", "content": text}]
        else:
            body["prompt"] = text
        if self.extra_body:
            body.update(self.extra_body)
        return body
