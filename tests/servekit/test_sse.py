from __future__ import annotations

import json

import pytest

from servekit.errors import QueueFull, UpstreamError
from servekit.sse import DONE_FRAME, EventReader, SSEDecoder, encode_data, encode_error


def test_encode_frames() -> None:
    assert encode_data({"a": "é"}) == 'data: {"a":"é"}\n\n'.encode()
    assert DONE_FRAME == b"data: [DONE]\n\n"
    frame = encode_error(QueueFull("busy", retry_after=2))
    payload = json.loads(frame.decode()[len("data: ") :])
    assert payload["error"]["type"] == "rate_limit_error"
    assert payload["error"]["code"] == "queue_full"


def test_decoder_handles_arbitrary_splits() -> None:
    stream = b'data: {"x":1}\n\n: keep-alive\n\ndata: {"x":2}\r\n\r\ndata: [DONE]\n\n'
    for size in (1, 2, 3, 7, len(stream)):
        decoder = SSEDecoder()
        events: list[str] = []
        for i in range(0, len(stream), size):
            events += decoder.feed(stream[i : i + size])
        events += decoder.flush()
        assert events == ['{"x":1}', '{"x":2}', "[DONE]"], size


def test_decoder_multiline_data_other_fields_and_unterminated_tail() -> None:
    decoder = SSEDecoder()
    events = decoder.feed(b"event: message\ndata: a\ndata: b\nid: 7\n\ndata:c")
    assert events == ["a\nb"]
    assert decoder.flush() == ["c"]


def test_utf8_split_across_chunks() -> None:
    raw = 'data: {"t":"中文"}\n\n'.encode()
    decoder = SSEDecoder()
    out = decoder.feed(raw[:12]) + decoder.feed(raw[12:])
    assert json.loads(out[0]) == {"t": "中文"}


def test_event_reader_cuts_at_event_boundaries_across_chunks() -> None:
    reader = EventReader()
    assert reader.split(b'data: {"a": 1}\n\ndata: {"b"') == b'data: {"a": 1}\n\n'
    assert reader.pending == b'data: {"b"'
    assert reader.feed(b": 2}\r\n\r\ndata: [DONE]\n\n") == [{"b": 2}]
    assert reader.done
    assert EventReader().feed(b"data: not json\n\n") == []
    with pytest.raises(UpstreamError):
        EventReader(strict=True).feed(b"data: not json\n\n")
    assert EventReader().flush() == []
    tail = EventReader()
    assert tail.feed(b'data: {"c": 3}') == []
    assert tail.flush() == [{"c": 3}]
