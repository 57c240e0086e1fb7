from __future__ import annotations

import json

from servekit.errors import QueueFull
from servekit.sse import DONE_FRAME, SSEDecoder, encode_data, encode_error


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
