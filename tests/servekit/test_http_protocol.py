"""The services' server protocol sends a response head together with its first body bytes."""

from __future__ import annotations

import asyncio
import socket
from typing import Any

import pytest

from hybrid_llm.local.servers import UvicornThread
from servekit.asgi import Receive, Scope, Send
from servekit.http_protocol import HeadWithBodyProtocol, HeadWithFirstWrite


class _Recorder(asyncio.Transport):
    def __init__(self) -> None:
        super().__init__()
        self.writes: list[bytes] = []
        self.closed = False

    def write(self, data: Any) -> None:
        self.writes.append(bytes(data))

    def close(self) -> None:
        self.closed = True

    def is_closing(self) -> bool:
        return self.closed


@pytest.mark.anyio
async def test_head_leaves_with_the_first_body_write() -> None:
    inner = _Recorder()
    out = HeadWithFirstWrite(inner, asyncio.get_running_loop())
    out.write(b"HEAD\r\n\r\n")
    assert inner.writes == []
    out.write(b"first")
    out.write(b"second")
    assert inner.writes == [b"HEAD\r\n\r\nfirst", b"second"]
    await asyncio.sleep(0.01)  # the fallback flush was cancelled: nothing more is written
    assert inner.writes == [b"HEAD\r\n\r\nfirst", b"second"]


@pytest.mark.anyio
async def test_a_lone_head_is_written_after_one_loop_iteration() -> None:
    inner = _Recorder()
    out = HeadWithFirstWrite(inner, asyncio.get_running_loop())
    out.write(b"HEAD")
    await asyncio.sleep(0)
    assert inner.writes == [b"HEAD"]
    out.write(b"body")
    assert inner.writes == [b"HEAD", b"body"]


@pytest.mark.anyio
async def test_close_writes_a_held_head_first() -> None:
    inner = _Recorder()
    out = HeadWithFirstWrite(inner, asyncio.get_running_loop())
    out.write(b"HEAD")
    out.close()
    assert inner.writes == [b"HEAD"]
    assert inner.closed
    assert out.is_closing()


async def _streaming_app(scope: Scope, receive: Receive, send: Send) -> None:
    if scope["type"] != "http":
        return
    more = True
    while more:  # read the body (this is what answers "Expect: 100-continue")
        message = await receive()
        more = message.get("more_body", False)
    headers = [(b"content-type", b"text/event-stream")]
    await send({"type": "http.response.start", "status": 200, "headers": headers})
    await send({"type": "http.response.body", "body": b"data: first\n\n", "more_body": True})
    await asyncio.sleep(0.2)
    await send({"type": "http.response.body", "body": b"data: second\n\n"})


def _read_until(sock: socket.socket, marker: bytes) -> bytes:
    data = b""
    while marker not in data:
        part = sock.recv(65536)
        if not part:
            break
        data += part
    return data


_SOCKET_WRITES: list[bytes] = []


class _Tap(asyncio.Transport):
    """The server's real socket transport, with its writes noted."""

    def __init__(self, inner: asyncio.Transport) -> None:
        super().__init__()
        self._inner = inner

    def write(self, data: Any) -> None:
        _SOCKET_WRITES.append(bytes(data))
        self._inner.write(data)

    def close(self) -> None:
        self._inner.close()

    def is_closing(self) -> bool:
        return self._inner.is_closing()

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return self._inner.get_extra_info(name, default)

    def pause_reading(self) -> None:
        self._inner.pause_reading()

    def resume_reading(self) -> None:
        self._inner.resume_reading()


class _TappedProtocol(HeadWithBodyProtocol):
    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(_Tap(transport))


@pytest.fixture
def server() -> Any:
    _SOCKET_WRITES.clear()
    with UvicornThread(_streaming_app, http=_TappedProtocol) as srv:
        yield srv


def test_head_and_first_chunk_are_one_socket_write(server: UvicornThread) -> None:
    with socket.create_connection(("127.0.0.1", server.port), timeout=5) as sock:
        request = b"POST /x HTTP/1.1\r\nhost: t\r\ncontent-length: 2\r\n\r\n{}"
        for _ in range(2):  # keep-alive: the second response is held back the same way
            _SOCKET_WRITES.clear()
            sock.sendall(request)
            answer = _read_until(sock, b"0\r\n\r\n")
            assert answer.startswith(b"HTTP/1.1 200 OK\r\n")
            assert b"data: first" in answer
            assert b"data: second" in answer
            first = _SOCKET_WRITES[0]
            assert first.startswith(b"HTTP/1.1 200 OK\r\n")
            assert b"transfer-encoding: chunked" in first
            assert first.endswith(b"data: first\n\n\r\n")
            assert len(_SOCKET_WRITES) == 2  # the second chunk and the end: one more write


def test_expect_100_continue_still_answers(server: UvicornThread) -> None:
    with socket.create_connection(("127.0.0.1", server.port), timeout=5) as sock:
        head = b"POST /x HTTP/1.1\r\nhost: t\r\ncontent-length: 2\r\nexpect: 100-continue\r\n\r\n"
        sock.sendall(head)
        assert _read_until(sock, b"\r\n\r\n").startswith(b"HTTP/1.1 100 Continue")
        sock.sendall(b"{}")
        answer = _read_until(sock, b"0\r\n\r\n")
        assert b"200 OK" in answer
        assert b"data: second" in answer
