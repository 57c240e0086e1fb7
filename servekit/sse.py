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

from servekit.errors import ServeError, UpstreamError, error_from_body

__all__ = [
    "DONE",
    "DONE_FRAME",
    "EventReader",
    "SSEDecoder",
    "aiter_events",
    "encode_data",
    "encode_error",
    "event_error",
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


class EventReader:
    """The JSON events of one OpenAI stream, fed its raw bytes as they arrive.

    :meth:`split` cuts the complete events off what arrived (a relay forwards
    them untouched, never half an event); :meth:`parse` decodes complete
    events into JSON objects; :meth:`feed` does both. :attr:`done` turns true
    at ``[DONE]``. An event that is not a JSON object is skipped, or raises
    :class:`~servekit.errors.UpstreamError` with ``strict``. The router's
    relay, its continuation, the central gateway's HTTP engine and the bench
    client all read streams with it.
    """

    __slots__ = ("_decoder", "_pending", "done", "strict")

    def __init__(self, *, strict: bool = False) -> None:
        self._decoder = SSEDecoder()
        self._pending = b""
        self.strict = strict
        self.done = False

    def split(self, chunk: bytes) -> bytes:
        """The complete events among what arrived so far (the rest waits)."""
        buffer = self._pending + chunk if self._pending else chunk
        cut = max(buffer.rfind(b"\n\n") + 2, buffer.rfind(b"\r\n\r\n") + 4)
        if cut < 2:
            self._pending = buffer
            return b""
        self._pending = buffer[cut:]
        return buffer[:cut]

    @property
    def pending(self) -> bytes:
        """Bytes of an event not complete yet."""
        return self._pending

    def parse(self, complete: bytes) -> list[dict[str, Any]]:
        """The JSON objects of complete events (``[DONE]`` sets :attr:`done`)."""
        out: list[dict[str, Any]] = []
        for data in self._decoder.feed(complete):
            if data == DONE:
                self.done = True
                continue
            try:
                obj = json.loads(data)
            except ValueError:
                if self.strict:
                    raise UpstreamError(f"upstream sent a malformed event: {data[:80]!r}") from None
                continue
            if isinstance(obj, dict):
                out.append(obj)
        return out

    def feed(self, chunk: bytes) -> list[dict[str, Any]]:
        return self.parse(self.split(chunk))

    def flush(self) -> list[dict[str, Any]]:
        """End of stream: an event without its closing blank line still counts."""
        rest, self._pending = self._pending, b""
        return self.parse(rest + b"\n\n") if rest.strip() else []


def event_error(event: dict[str, Any]) -> ServeError | None:
    """The error an OpenAI error event carries (``None``: not one)."""
    if event.get("error"):
        return error_from_body(502, event)
    return None


async def aiter_events(chunks: AsyncIterator[bytes]) -> AsyncIterator[str]:
    """Decode an async byte stream into SSE data payloads (``[DONE]`` included)."""
    decoder = SSEDecoder()
    async for chunk in chunks:
        for event in decoder.feed(chunk):
            yield event
    for event in decoder.flush():
        yield event
