"""The services' connection guards over real sockets: a client that stops reading is
cut off and its handler ends; slow or huge request heads and connection floods are refused."""

from __future__ import annotations

import asyncio
import json
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from hybrid_llm.local.servers import UvicornThread
from servekit.asgi import DisconnectWatch, Receive, Scope, Send
from servekit.connection_guard import ConnectionLimits, guarded_protocol
from servekit.settings import ServerSettings
from tests.support.pki import PrivateCA

REQUEST = b"GET /stream HTTP/1.1\r\nhost: t\r\n\r\n"


class _Endless:
    """Streams 4 KiB chunks as fast as the transport takes them, until the client goes."""

    def __init__(self) -> None:
        self.ended = threading.Event()
        self.sent = 0

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return
        await receive()  # the (empty) body
        watch = DisconnectWatch(receive)  # as the completion endpoints do
        try:
            start = {"type": "http.response.start", "status": 200, "headers": []}
            await send(start)
            chunk = b"x" * 4096
            while True:
                await send({"type": "http.response.body", "body": chunk, "more_body": True})
                self.sent += len(chunk)
                await asyncio.sleep(0)
        except asyncio.CancelledError:
            if not watch.gone():
                raise
        finally:
            watch.close()
            self.ended.set()


def _serve(app: object, limits: ConnectionLimits) -> UvicornThread:
    return UvicornThread(app, http=guarded_protocol(limits))


def _client(port: int) -> socket.socket:
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)  # fills fast when not read
    sock.settimeout(10)
    sock.connect(("127.0.0.1", port))
    return sock


@pytest.fixture
def endless() -> Iterator[tuple[_Endless, UvicornThread]]:
    app = _Endless()
    with _serve(app, ConnectionLimits(send_stall_s=0.5)) as server:
        yield app, server


def test_a_client_that_stops_reading_is_cut_off_and_its_handler_ends(
    endless: tuple[_Endless, UvicornThread],
) -> None:
    app, server = endless
    with _client(server.port) as sock:
        sock.sendall(REQUEST)
        assert sock.recv(1024).startswith(b"HTTP/1.1 200")
        started = time.monotonic()
        # Stop reading: the server's buffers fill, then the stall clock runs out.
        assert app.ended.wait(10), "the handler still runs for a client that reads nothing"
        assert time.monotonic() - started < 5
        sent = app.sent
        time.sleep(0.2)
        assert app.sent == sent  # nothing more is produced for it


def test_a_tls_client_that_stops_reading_is_cut_off_too(tmp_path: Path) -> None:
    """Over TLS the flow-control calls come from the TLS layer's own buffer."""
    ca = PrivateCA(tmp_path)
    issued = ca.issue()
    app = _Endless()
    tls = {"ssl_certfile": str(issued.cert_file), "ssl_keyfile": str(issued.key_file)}
    limits = ConnectionLimits(send_stall_s=0.5)
    with UvicornThread(app, http=guarded_protocol(limits), **tls) as server:
        raw = _client(server.port)
        with ca.client_context().wrap_socket(raw, server_hostname="127.0.0.1") as sock:
            sock.sendall(REQUEST)
            assert sock.recv(1024).startswith(b"HTTP/1.1 200")
            assert app.ended.wait(10), "the handler still runs for a client that reads nothing"


def test_a_client_that_keeps_reading_is_never_cut_off() -> None:
    app = _Endless()
    with (
        _serve(app, ConnectionLimits(send_stall_s=1.0)) as server,
        socket.create_connection(("127.0.0.1", server.port), timeout=10) as sock,
    ):
        sock.sendall(REQUEST)
        deadline = time.monotonic() + 3.0  # three stall periods
        while time.monotonic() < deadline:
            assert sock.recv(65536)
        assert not app.ended.is_set()


def _closed_within(sock: socket.socket, seconds: float) -> bytes:
    """Everything the server wrote before closing; fails if it is still open after ``seconds``."""
    sock.settimeout(seconds)
    data = b""
    try:
        while part := sock.recv(65536):
            data += part
    except TimeoutError:
        pytest.fail(f"connection still open after {seconds}s; it sent {data[:80]!r}")
    return data


async def _ok(scope: Scope, receive: Receive, send: Send) -> None:
    if scope["type"] != "http":
        return
    await send({"type": "http.response.start", "status": 200, "headers": []})
    await send({"type": "http.response.body", "body": b"ok"})


def test_a_slow_request_head_gets_408_and_the_connection_closes() -> None:
    with _serve(_ok, ConnectionLimits(header_timeout_s=0.5)) as server:
        with socket.create_connection(("127.0.0.1", server.port)) as sock:
            sock.sendall(b"GET / HTTP/1.1\r\nhost: t\r\n")  # and never the blank line
            assert _closed_within(sock, 5).startswith(b"HTTP/1.1 408")
        with socket.create_connection(("127.0.0.1", server.port)) as sock:
            assert _closed_within(sock, 5).startswith(b"HTTP/1.1 408")  # sends nothing at all
        with socket.create_connection(("127.0.0.1", server.port)) as sock:
            for _ in range(2):  # kept alive: each request's head gets the clock afresh
                time.sleep(0.3)
                sock.sendall(b"GET / HTTP/1.1\r\nhost: t\r\n\r\n")
                assert sock.recv(1024).startswith(b"HTTP/1.1 200")
            sock.sendall(b"GET / HTTP/1.1\r\n")
            assert _closed_within(sock, 5).startswith(b"HTTP/1.1 408")


def test_a_huge_request_head_gets_431() -> None:
    with _serve(_ok, ConnectionLimits(max_header_bytes=16384)) as server:
        with socket.create_connection(("127.0.0.1", server.port)) as sock:
            # Well past the cap, still sending after the server has refused it: its
            # close must not turn into a reset that destroys the answer.
            sock.sendall(b"GET / HTTP/1.1\r\nhost: t\r\nx-big: " + b"a" * 200_000)
            assert _closed_within(sock, 5).startswith(b"HTTP/1.1 431")
        with socket.create_connection(("127.0.0.1", server.port)) as sock:
            sock.sendall(b"GET / HTTP/1.1\r\nhost: t\r\nx-fine: " + b"a" * 8000 + b"\r\n\r\n")
            assert sock.recv(1024).startswith(b"HTTP/1.1 200")


def test_connections_over_the_cap_get_503_in_the_openai_shape() -> None:
    with _serve(_ok, ConnectionLimits(max_connections=2)) as server:
        held = [socket.create_connection(("127.0.0.1", server.port)) for _ in range(2)]
        try:
            for sock in held:
                sock.sendall(b"GET / HTTP/1.1\r\nhost: t\r\n\r\n")
                assert sock.recv(1024).startswith(b"HTTP/1.1 200")
            with socket.create_connection(("127.0.0.1", server.port)) as extra:
                extra.sendall(b"GET / HTTP/1.1\r\nhost: t\r\n\r\n")
                answer = _closed_within(extra, 5)
            head, _, body = answer.partition(b"\r\n\r\n")
            assert head.startswith(b"HTTP/1.1 503")
            assert b"retry-after: 1" in head.lower()
            assert json.loads(body)["error"]["code"] == "too_many_connections"
        finally:
            for sock in held:
                sock.close()
        time.sleep(0.2)  # the server notices the two closed
        with socket.create_connection(("127.0.0.1", server.port)) as sock:
            sock.sendall(b"GET / HTTP/1.1\r\nhost: t\r\n\r\n")
            assert sock.recv(1024).startswith(b"HTTP/1.1 200")


def test_services_run_with_the_guards_on_by_default() -> None:
    limits = ServerSettings().connection_limits()
    assert None not in (limits.send_stall_s, limits.header_timeout_s)
    assert None not in (limits.max_header_bytes, limits.max_connections)
