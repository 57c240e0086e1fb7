"""Shared bits for model_sync tests: artifacts on disk and an HTTP server that
drops the connection mid-body."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path
from typing import Any

import anyio

from model_sync.records import ArtifactRecord

Scope = dict[str, Any]


def make_artifact(path: Path, size: int = 1_500_000) -> tuple[bytes, str]:
    data = os.urandom(size)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
    return data, hashlib.sha256(data).hexdigest()


def record_for(
    name: str, version: str, uri: str, data: bytes, filename: str = "model.gguf"
) -> ArtifactRecord:
    return ArtifactRecord(
        name=name,
        version=version,
        uri=uri,
        filename=filename,
        sha256=hashlib.sha256(data).hexdigest(),
        size=len(data),
    )


class CutConnection:
    """ASGI wrapper: the first ``cuts`` responses stop after ``cut_after`` body
    bytes and the server drops the connection; it records every Range header."""

    def __init__(self, app: Any, cut_after: int, cuts: int = 1) -> None:
        self.app = app
        self.cut_after = cut_after
        self.cuts_left = cuts
        self.ranges: list[str | None] = []

    async def __call__(self, scope: Scope, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = dict(scope["headers"])
        rng = headers.get(b"range")
        self.ranges.append(rng.decode() if rng else None)
        if self.cuts_left <= 0:
            await self.app(scope, receive, send)
            return
        self.cuts_left -= 1
        sent = 0

        async def cut_send(message: dict[str, Any]) -> None:
            nonlocal sent
            if message["type"] == "http.response.body":
                body = message.get("body", b"")
                if sent + len(body) > self.cut_after:
                    part = body[: self.cut_after - sent]
                    await send({"type": "http.response.body", "body": part, "more_body": True})
                    raise ConnectionAbortedError("test cuts the connection mid-body")
                sent += len(body)
            await send(message)

        await self.app(scope, receive, cut_send)


class SlowBody:
    """ASGI wrapper that sleeps before every response body chunk (a slow link)."""

    def __init__(self, app: Any, delay_s: float) -> None:
        self.app = app
        self.delay_s = delay_s

    async def __call__(self, scope: Scope, receive: Any, send: Any) -> None:
        async def slow_send(message: dict[str, Any]) -> None:
            if message["type"] == "http.response.body":
                await anyio.sleep(self.delay_s)
            await send(message)

        await self.app(scope, receive, slow_send)
