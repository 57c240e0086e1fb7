"""Conversations from a file (``hybrid-llm bench --dataset FILE``).

JSON lines, or one JSON array, in any of these shapes (``--dataset-format
auto`` tells them apart by their keys):

- OpenAI message lists: ``{"messages": [...]}``; everything before the last
  user message is sent as given (system prompt, history), the last user
  message is the turn. Optional ``max_tokens``.
- ShareGPT: ``{"conversations": [{"from": "system"|"human"|"gpt", "value": ...}]}``;
  the human turns are sent one after another with the model's real answers
  as history (the file's ``gpt`` answers are not replayed).
- aiperf ``single_turn``: ``{"text": ...}`` (or ``"texts": [...]``, joined),
  optional ``output_length``; aiperf ``multi_turn``: ``{"session_id": ...,
  "turns": [{"text": ..., "output_length": ...}, ...]}``, a leading
  ``"role": "system"`` turn becoming the system prompt (aiperf's own rule).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Literal

from hybrid_llm.bench.conversations import Conversation, ConversationWorkload

__all__ = ["Format", "dataset_workload", "parse_dataset"]

Format = Literal["auto", "openai", "sharegpt", "aiperf"]


def _records(path: Path) -> Iterator[Any]:
    text = path.read_text(encoding="utf-8")
    stripped = text.lstrip()
    if stripped.startswith("["):
        data = json.loads(stripped)
        if not isinstance(data, list):
            raise ValueError(f"{path}: expected a JSON array or JSON lines")
        yield from data
        return
    # JSON lines end at "\n" only: str.splitlines() also splits inside strings at
    # U+2028, U+0085 and friends, which real chat text (ShareGPT) carries raw.
    for number, line in enumerate(text.split("\n"), 1):
        if line.strip():
            try:
                yield json.loads(line)
            except ValueError as exc:
                raise ValueError(f"{path}:{number}: not JSON: {exc}") from None


def _kind(record: Any) -> str:
    if not isinstance(record, dict):
        raise ValueError("each record must be a JSON object")
    for key, kind in (
        ("messages", "openai"),
        ("conversations", "sharegpt"),
        ("turns", "aiperf"),
        ("text", "aiperf"),
        ("texts", "aiperf"),
    ):
        if key in record:
            return kind
    raise ValueError(f"record with keys {sorted(record)} is in no known dataset format")


def _text(value: Any) -> str:
    if isinstance(value, str):
        return value
    if isinstance(value, list):
        return "\n".join(str(v) for v in value)
    raise ValueError(f"expected text, got {type(value).__name__}")


def _openai(record: dict[str, Any]) -> Conversation:
    messages = record["messages"]
    if not isinstance(messages, list) or not messages:
        raise ValueError("messages must be a non-empty list")
    last = messages[-1]
    if not isinstance(last, dict) or last.get("role") != "user":
        raise ValueError("the last message must be the user's")
    limit = record.get("max_tokens")
    return Conversation("dataset", tuple(messages[:-1]), (_text(last.get("content")),), _int(limit))


def _sharegpt(record: dict[str, Any]) -> Conversation:
    prefix: list[dict[str, Any]] = []
    turns: list[str] = []
    for item in record["conversations"]:
        who = item.get("from")
        if who == "system" and not turns:
            prefix.append({"role": "system", "content": _text(item.get("value"))})
        elif who in ("human", "user"):
            turns.append(_text(item.get("value")))
    if not turns:
        raise ValueError("a ShareGPT conversation without a human turn")
    return Conversation("dataset", tuple(prefix), tuple(turns))


def _aiperf(record: dict[str, Any]) -> Conversation:
    if "turns" not in record:
        text = _text(record["text"] if "text" in record else record["texts"])
        return Conversation("dataset", (), (text,), _int(record.get("output_length")))
    prefix: list[dict[str, Any]] = []
    turns: list[str] = []
    limit: int | None = None
    for i, turn in enumerate(record["turns"]):
        text = _text(turn.get("text", turn.get("texts")))
        if i == 0 and turn.get("role") == "system":
            prefix.append({"role": "system", "content": text})
            continue
        turns.append(text)
        limit = _int(turn.get("output_length")) or limit
    if not turns:
        raise ValueError("an aiperf session without a user turn")
    return Conversation("dataset", tuple(prefix), tuple(turns), limit)


def _int(value: Any) -> int | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"a token limit must be a positive integer, got {value!r}")
    return value


_PARSERS = {"openai": _openai, "sharegpt": _sharegpt, "aiperf": _aiperf}


def parse_dataset(path: Path, fmt: Format = "auto") -> list[Conversation]:
    """Every conversation in ``path``; a malformed record names its index."""
    out = []
    for index, record in enumerate(_records(path)):
        try:
            kind = _kind(record) if fmt == "auto" else fmt
            out.append(_PARSERS[kind](record))
        except (KeyError, TypeError, ValueError) as exc:
            raise ValueError(f"{path}: record {index}: {exc}") from None
    if not out:
        raise ValueError(f"{path}: no conversations")
    return out


def dataset_workload(
    path: Path, model: str, *, fmt: Format = "auto", max_tokens: int = 64, seed: int = 0
) -> ConversationWorkload:
    return ConversationWorkload(
        model, {"dataset": parse_dataset(path, fmt)}, {"dataset": 1.0}, max_tokens, seed
    )
