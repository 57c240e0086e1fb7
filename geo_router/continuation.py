"""What a routed answer has said so far, and splicing a continuation into it.

A :class:`Transcript` belongs to one routed stream (``geo_router.routed``).
Passed-through events are kept raw and parsed only when someone asks (a
continuation, a non-streamed answer). When an upstream dies mid-stream the
answer goes on elsewhere from :meth:`Transcript.partial` (the request is
extended by ``geo_router.request.continued``); the continuation's chunks are
rewritten to the original stream's id, model and created time (and its usage
to the whole answer's) so the client sees one well-formed stream.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

from servekit.continuation import TokenCount
from servekit.errors import ServeError
from servekit.sse import DONE_FRAME, EventReader, encode_data

_USAGE = b'"usage"'

__all__ = ["Kind", "Partial", "Transcript", "assemble", "without_usage"]

Kind = Literal["chat", "completion"]


@dataclass(frozen=True, slots=True)
class Partial:
    """What the client already has of the answer."""

    text: str
    tokens: int  # completion tokens, as the upstream counted them


@dataclass(slots=True)
class Transcript:
    kind: Kind
    id: str | None = None
    model: str | None = None
    created: int | None = None
    parts: list[str] = field(default_factory=list)
    count: TokenCount = field(default_factory=TokenCount)
    finish_reason: str | None = None
    usage: dict[str, Any] | None = None
    continued: int = 0  # how many continuations are spliced in
    error: ServeError | None = None  # set when the stream ended with an error event
    raw: list[bytes] = field(default_factory=list)  # passed-through events not parsed yet

    def record(self, complete: bytes) -> None:
        """Keep complete passed-through events; parsed only if someone asks (:meth:`sync`)."""
        self.raw.append(complete)

    def sync(self) -> None:
        """Parse what :meth:`record` kept, so text, tokens and finish are current."""
        if not self.raw:
            return
        data = b"".join(self.raw)
        self.raw.clear()
        for event in EventReader().parse(data):
            self.observe(event)

    def partial(self) -> Partial:
        """What the client has so far: the text and its completion tokens."""
        self.sync()
        return Partial(self.text, self.tokens)

    @property
    def text(self) -> str:
        return "".join(self.parts)

    @property
    def tokens(self) -> int:
        """Completion tokens so far (:class:`~servekit.continuation.TokenCount`)."""
        return self.count.tokens

    def observe(self, event: dict[str, Any]) -> None:
        if self.id is None:
            self.id = event.get("id") if isinstance(event.get("id"), str) else None
            self.model = event.get("model") if isinstance(event.get("model"), str) else None
            created = event.get("created")
            self.created = created if isinstance(created, int) else None
        usage = event.get("usage")
        if isinstance(usage, dict):
            self.usage = usage
        choices = event.get("choices")
        if not isinstance(choices, list) or not choices or not isinstance(choices[0], dict):
            self.count.observe(event, None)
            return
        choice = choices[0]
        if self.kind == "chat":
            delta = choice.get("delta")
            text = delta.get("content") if isinstance(delta, dict) else None
        else:
            text = choice.get("text")
        if not isinstance(text, str):
            text = None
        if text:
            self.parts.append(text)
        self.count.observe(event, text)
        reason = choice.get("finish_reason")
        if isinstance(reason, str):
            self.finish_reason = reason

    def splice_events(self, complete: bytes, sent_before: int) -> bytes:
        """A continuation's complete events as frames of the original stream."""
        reader = EventReader()
        frames = [self.splice(event, sent_before) for event in reader.parse(complete)]
        out = b"".join(f for f in frames if f)
        return out + DONE_FRAME if reader.done else out

    def splice(self, event: dict[str, Any], sent_before: int) -> bytes | None:
        """A continuation's event as a frame of the original stream, observed as
        such (its usage counts the whole answer); ``None``: drop it."""
        rewritten = self.rewrite(event, sent_before)
        if rewritten is None:
            return None
        self.observe(rewritten)
        return encode_data(rewritten)

    def rewrite(self, event: dict[str, Any], sent_before: int) -> dict[str, Any] | None:
        """A continuation's event as part of the original stream (``None``: drop it)."""
        event = dict(event)
        if self.id is not None:
            event["id"] = self.id
        if self.model is not None:
            event["model"] = self.model
        if self.created is not None:
            event["created"] = self.created
        usage = event.get("usage")
        if isinstance(usage, dict):
            usage = dict(usage)
            done = int(usage.get("completion_tokens", 0)) + sent_before
            usage["completion_tokens"] = done
            usage["total_tokens"] = int(usage.get("prompt_tokens", 0)) + done
            event["usage"] = usage
        choices = event.get("choices")
        if isinstance(choices, list) and choices and isinstance(choices[0], dict):
            choice = dict(choices[0])
            delta = choice.get("delta")
            if isinstance(delta, dict) and "role" in delta:
                delta = {k: v for k, v in delta.items() if k != "role"}
                choice["delta"] = delta
                if not delta.get("content") and not choice.get("finish_reason"):
                    return None  # the continuation's opening role chunk
            event["choices"] = [choice, *choices[1:]]
        return event

    def final_chunk(self, reason: str) -> bytes:
        """A closing chunk with ``finish_reason`` (when nothing is left to generate)."""
        choice: dict[str, Any] = {"index": 0, "finish_reason": reason, "logprobs": None}
        if self.kind == "chat":
            choice["delta"] = {}
            obj = "chat.completion.chunk"
        else:
            choice["text"] = ""
            obj = "text_completion"
        return encode_data(
            {
                "id": self.id,
                "object": obj,
                "created": self.created,
                "model": self.model,
                "choices": [choice],
            }
        )


def assemble(state: Transcript) -> dict[str, Any]:
    """The non-streamed response equivalent to a finished stream."""
    state.sync()
    reason = state.finish_reason or "stop"
    if state.kind == "chat":
        obj = "chat.completion"
        choice: dict[str, Any] = {
            "index": 0,
            "message": {"role": "assistant", "content": state.text},
            "finish_reason": reason,
            "logprobs": None,
        }
    else:
        obj = "text_completion"
        choice = {"index": 0, "text": state.text, "finish_reason": reason, "logprobs": None}
    out: dict[str, Any] = {
        "id": state.id,
        "object": obj,
        "created": state.created,
        "model": state.model,
        "choices": [choice],
    }
    if state.usage is not None:
        out["usage"] = state.usage
    return out


def without_usage(complete: bytes) -> bytes:
    """Complete events as a client that did not ask for usage sees them: the router asks
    every upstream for it (the token limit settles from it), so the usage-only event is
    dropped and any other event's ``usage`` removed; ``[DONE]`` is kept. Events without
    usage pass untouched (one substring test on the hot path)."""
    if _USAGE not in complete:
        return complete
    reader = EventReader()
    frames = []
    for event in reader.parse(complete):
        if "usage" in event:
            if not event.get("choices"):
                continue
            event = {k: v for k, v in event.items() if k != "usage"}
        frames.append(encode_data(event))
    out = b"".join(frames)
    return out + DONE_FRAME if reader.done else out
