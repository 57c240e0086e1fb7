"""Server-sent events as OpenAI streams them: ``data: {json}\\n\\n`` frames, ``[DONE]``.

Encoding is a pair of functions; decoding is an incremental parser fed with raw
byte chunks as they arrive from a socket, so a proxy can forward each event the
moment it is complete.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

from pydantic import BaseModel

from servekit.errors import ServeError

__all__ = [
    "DONE",
    "DONE_FRAME",
    "SSEDecoder",
    "aiter_events",
    "encode_data",
    "encode_error",
]

DONE = "[DONE]"
DONE_FRAME = b"data: [DONE]\n\n"


def encode_data(payload: BaseModel | dict[str, Any] | str) -> bytes:
    """One ``data:`` frame. Models are dumped without ``None`` noise only where safe."""
    if isinstance(payload, BaseModel):
        text = payload.model_dump_json()
    elif isinstance(payload, dict):
        text = json.dumps(payload, ensure_ascii=False, separators=(",", ":"))
    else:
        text = payload
    # A newline inside data would split the frame; JSON never has raw ones.
    return b"data: " + text.encode("utf-8", errors="replace") + b"\n\n"


def encode_error(error: ServeError) -> bytes:
    """An OpenAI error event, sent when a stream fails after its first byte."""
    return encode_data(error.body())


class SSEDecoder:
    """Incremental SSE parser: feed bytes, get the ``data`` of completed events.

    Handles ``\\r\\n`` and ``\\n`` line ends, comment lines (``: ping``),
    multi-line data (joined with ``\\n``) and fields other than ``data``
    (ignored), per the WHATWG event-stream rules.
    """

    def __init__(self) -> None:
        self._buffer = b""
        self._data: list[str] = []

    def feed(self, chunk: bytes) -> list[str]:
        self._buffer += chunk
        events: list[str] = []
        while True:
            idx = self._buffer.find(b"\n")
            if idx < 0:
                break
            line = self._buffer[:idx]
            self._buffer = self._buffer[idx + 1 :]
            if line.endswith(b"\r"):
                line = line[:-1]
            event = self._line(line.decode("utf-8", errors="replace"))
            if event is not None:
                events.append(event)
        return events

    def flush(self) -> list[str]:
        """End of stream: a final event without its blank line still counts."""
        events = self.feed(b"\n") if self._buffer else []
        if self._data:
            events.append("\n".join(self._data))
            self._data = []
        return events

    def _line(self, line: str) -> str | None:
        if line == "":
            if not self._data:
                return None
            data = "\n".join(self._data)
            self._data = []
            return data
        if line.startswith(":"):
            return None
        field, _, value = line.partition(":")
        if value.startswith(" "):
            value = value[1:]
        if field == "data":
            self._data.append(value)
        return None


async def aiter_events(chunks: AsyncIterator[bytes]) -> AsyncIterator[str]:
    """Decode an async byte stream into SSE data payloads (``[DONE]`` included)."""
    decoder = SSEDecoder()
    async for chunk in chunks:
        for event in decoder.feed(chunk):
            yield event
    for event in decoder.flush():
        yield event
