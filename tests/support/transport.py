"""Doubles of the upstream stack: a scripted transport, and an address that never answers."""

from __future__ import annotations

import json
import socket
from collections.abc import AsyncIterator, Iterator, Mapping
from contextlib import ExitStack, contextmanager
from typing import Any

from servekit.peers import PeerCredentials


class FakeResponse:
    """A response whose head arrived, its body in ``parts``; counts what is done to it."""

    def __init__(
        self,
        status: int,
        parts: list[bytes],
        headers: dict[str, str] | None = None,
        *,
        then: BaseException | None = None,
    ) -> None:
        self.status = status
        self._then = then  # raised after the parts: a connection that broke off
        self.headers = headers or {}
        self._parts = parts
        self.closed = self.released = 0
        self.flowed = False

    async def chunks(self) -> AsyncIterator[bytes]:
        for part in self._parts:
            yield part
        if self._then is not None:
            raise self._then

    async def read(self) -> bytes:
        if self._then is not None:
            raise self._then
        return b"".join(self._parts)

    def flowing(self) -> None:
        self.flowed = True

    def release(self) -> None:
        self.released += 1

    def close(self) -> None:
        self.closed += 1


class FakeTransport:
    """Answers each POST with the next scripted response, or raises the next exception."""

    def __init__(self, *responses: FakeResponse | BaseException) -> None:
        self.responses = list(responses)
        self.sent: list[dict[str, Any]] = []  # the JSON bodies
        self.urls: list[str] = []
        self.headers: list[dict[str, str]] = []

    async def post(
        self,
        url: str,
        payload: bytes,
        headers: Mapping[str, str],
        peer: PeerCredentials | None = None,
    ) -> FakeResponse:
        self.sent.append(json.loads(payload))
        self.urls.append(url)
        self.headers.append(dict(headers))
        answer = self.responses.pop(0)
        if isinstance(answer, BaseException):
            raise answer
        return answer

    async def close(self) -> None:
        pass


@contextmanager
def unanswered_url() -> Iterator[str]:
    """A port whose accept queue is full: a connect hangs until it times out."""
    with ExitStack() as stack:
        listener = stack.enter_context(socket.socket())
        listener.bind(("127.0.0.1", 0))
        listener.listen(0)
        port = listener.getsockname()[1]
        queued = stack.enter_context(socket.socket())
        queued.connect(("127.0.0.1", port))  # fills the queue; nobody accepts
        yield f"http://127.0.0.1:{port}"
