"""The router's lean upstream HTTP client against a raw socket server that misbehaves on cue."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

import pytest

from hybrid_llm.local.servers import free_port
from servekit.http_client import ConnectError, ConnectionBroken, UpstreamPool

Handler = Callable[[asyncio.StreamReader, asyncio.StreamWriter, int], Awaitable[None]]


async def _read_request(reader: asyncio.StreamReader) -> bytes:
    head = await reader.readuntil(b"\r\n\r\n")
    length = 0
    for line in head.split(b"\r\n"):
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length":
            length = int(value)
    return head + await reader.readexactly(length)


def _chunked(*parts: bytes) -> bytes:
    return b"".join(b"%x\r\n%s\r\n" % (len(p), p) for p in parts) + b"0\r\n\r\n"


OK_HEAD = (
    b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n"
)


async def _serve(handler: Handler) -> tuple[asyncio.Server, str]:
    """A server calling ``handler`` per connection with the connection's number (from 1)."""
    connections = 0

    async def on_client(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        nonlocal connections
        connections += 1
        index = connections
        try:
            await handler(reader, writer, index)
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()

    server = await asyncio.start_server(on_client, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    return server, f"http://127.0.0.1:{port}/v1/chat/completions"


def _pool(read_timeout_s: float = 5.0) -> UpstreamPool:
    return UpstreamPool(connect_timeout_s=2.0, read_timeout_s=read_timeout_s)


def test_streams_chunks_and_reuses_the_connection() -> None:
    requests: list[tuple[int, bytes]] = []

    async def handler(r: asyncio.StreamReader, w: asyncio.StreamWriter, conn: int) -> None:
        while True:
            requests.append((conn, await _read_request(r)))
            w.write(OK_HEAD + b"%x\r\ndata: a\n\n\r\n" % len(b"data: a\n\n"))
            await w.drain()
            await asyncio.sleep(0.01)
            w.write(_chunked(b"data: b\n\n", b"data: [DONE]\n\n"))
            await w.drain()

    async def run() -> None:
        server, url = await _serve(handler)
        pool = _pool()
        try:
            for n in range(3):
                resp = await pool.post(url, b'{"n":%d}' % n, {"x-request-id": f"r{n}"})
                assert resp.status == 200
                assert resp.headers["content-type"] == "text/event-stream"
                body = await resp.read()
                assert body == b"data: a\n\ndata: b\n\ndata: [DONE]\n\n"
        finally:
            await pool.close()
            server.close()

    asyncio.run(run())
    assert [c for c, _ in requests] == [1, 1, 1]  # one connection, kept alive
    first = requests[0][1]
    assert first.startswith(b"POST /v1/chat/completions HTTP/1.1\r\n")
    assert b"\r\nx-request-id: r0\r\n" in first
    assert first.endswith(b'{"n":0}')
    assert b"\r\ncontent-length: 7\r\n" in first


def test_length_and_close_delimited_bodies() -> None:
    async def handler(r: asyncio.StreamReader, w: asyncio.StreamWriter, conn: int) -> None:
        await _read_request(r)
        if conn == 1:
            w.write(b"HTTP/1.1 500 Internal Server Error\r\ncontent-length: 5\r\n")
            w.write(b"retry-after: 3\r\n\r\noops!")
        else:
            w.write(b"HTTP/1.1 200 OK\r\nconnection: close\r\n\r\nuntil the end")
        await w.drain()

    async def run() -> None:
        server, url = await _serve(handler)
        pool = _pool()
        try:
            resp = await pool.post(url, b"{}", {})
            assert (resp.status, resp.headers["retry-after"]) == (500, "3")
            assert await resp.read() == b"oops!"
            resp = await pool.post(url, b"{}", {})
            assert await resp.read() == b"until the end"
        finally:
            await pool.close()
            server.close()

    asyncio.run(run())


def test_a_reused_connection_closed_by_the_server_is_retried_once() -> None:
    answered: list[int] = []

    async def handler(r: asyncio.StreamReader, w: asyncio.StreamWriter, conn: int) -> None:
        await _read_request(r)
        w.write(OK_HEAD + _chunked(b"data: [DONE]\n\n"))
        await w.drain()
        answered.append(conn)
        if conn == 1:  # keep-alive announced, then read the next request and hang up
            await _read_request(r)

    async def run() -> None:
        server, url = await _serve(handler)
        pool = _pool()
        try:
            for _ in range(2):
                resp = await pool.post(url, b"{}", {})
                assert await resp.read() == b"data: [DONE]\n\n"
        finally:
            await pool.close()
            server.close()

    asyncio.run(run())
    assert answered == [1, 2]


def test_failures_are_typed() -> None:
    async def handler(r: asyncio.StreamReader, w: asyncio.StreamWriter, conn: int) -> None:
        await _read_request(r)
        if conn == 1:  # head, one chunk, then the connection drops mid-stream
            w.write(OK_HEAD + b"9\r\ndata: a\n\n\r\n")
            await w.drain()
        elif conn == 2:  # head, then silence
            w.write(OK_HEAD)
            await w.drain()
            await asyncio.sleep(1)
        else:
            w.write(b"NOT HTTP AT ALL\r\n\r\n")
            await w.drain()

    async def run() -> None:
        server, url = await _serve(handler)
        pool = _pool(read_timeout_s=0.2)
        try:
            resp = await pool.post(url, b"{}", {})
            with pytest.raises(ConnectionBroken):
                await resp.read()
            resp = await pool.post(url, b"{}", {})
            with pytest.raises(TimeoutError):
                await resp.read()
            resp.close()
            with pytest.raises(ConnectionBroken):
                await pool.post(url, b"{}", {})
            with pytest.raises(ConnectError):
                await pool.post(f"http://127.0.0.1:{free_port()}/x", b"{}", {})
            with pytest.raises(ValueError, match="line break"):
                await pool.post(url, b"{}", {"x-request-id": "a\r\nx-evil: 1"})
        finally:
            await pool.close()
            server.close()

    asyncio.run(run())
