"""Talking to one upstream over httpx: open a stream primed with its first token.

This is the router's one httpx boundary: :func:`translate_error` is the only
place httpx exceptions become project errors (``servekit.errors``).
(``servekit.engine.openai_http`` does the same for the engines; the two
should converge on one shared function.)

A stream is "primed" when the upstream answered 200 and its first token
(or its end) has arrived; only then does the router commit to the client,
so connect errors, 5xx, 429 and a missed TTFT deadline can still fail over.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass, field
from typing import Any

import httpx

from servekit.errors import (
    ServeError,
    UpstreamError,
    UpstreamTimeout,
    UpstreamUnavailable,
    error_from_body,
)
from servekit.sse import DONE, SSEDecoder

__all__ = ["Primed", "open_stream", "split_events", "translate_error"]


def translate_error(exc: BaseException, url: str) -> ServeError:
    """The one mapping from httpx (and stream timeouts) to the project's error tree."""
    if isinstance(exc, ServeError):
        return exc
    if isinstance(exc, httpx.ConnectError | httpx.ConnectTimeout | httpx.PoolTimeout):
        return UpstreamUnavailable(f"cannot connect to upstream {url}: {exc or type(exc).__name__}")
    if isinstance(exc, httpx.TimeoutException | TimeoutError):
        return UpstreamTimeout(f"upstream {url} timed out")
    if isinstance(exc, httpx.RemoteProtocolError | httpx.ReadError | httpx.WriteError):
        return UpstreamUnavailable(f"upstream {url} closed the connection: {exc}")
    return UpstreamError(f"upstream {url} failed: {type(exc).__name__}: {exc}")


async def _error_from_response(resp: httpx.Response) -> ServeError:
    raw = await resp.aread()
    try:
        body: Any = json.loads(raw) if raw else None
    except ValueError:
        body = None
    retry: float | None = None
    header = resp.headers.get("retry-after")
    if header:
        try:
            retry = float(header)
        except ValueError:
            retry = None
    return error_from_body(resp.status_code, body, retry_after=retry)


def split_events(buffer: bytes) -> tuple[bytes, bytes]:
    """(complete events, the unfinished rest): cut after the last blank line."""
    cut = max(buffer.rfind(b"\n\n") + 2, buffer.rfind(b"\r\n\r\n") + 4)
    if cut < 2:
        return b"", buffer
    return buffer[:cut], buffer[cut:]


@dataclass(slots=True)
class Primed:
    """A 200 stream whose first token (or end) arrived; ``head`` is what was read."""

    url: str
    response: httpx.Response
    chunks: AsyncIterator[bytes]
    head: bytes
    events: list[dict[str, Any]]
    ttft_s: float
    done: bool = False
    rest: bytes = b""
    decoder: SSEDecoder = field(default_factory=SSEDecoder)

    async def aclose(self) -> None:
        await self.response.aclose()

    async def finish(self, timeout_s: float = 1.0) -> None:
        """After ``[DONE]``: read the transfer's tail so the connection is reused."""
        try:
            async with asyncio.timeout(timeout_s):
                async for _ in self.chunks:
                    pass
        except (httpx.HTTPError, TimeoutError):
            pass
        await self.response.aclose()


def parse_events(decoder: SSEDecoder, complete: bytes) -> tuple[list[dict[str, Any]], bool]:
    """Decode complete frames into JSON objects; ``True`` when ``[DONE]`` was among them."""
    out: list[dict[str, Any]] = []
    done = False
    for data in decoder.feed(complete):
        if data == DONE:
            done = True
            continue
        try:
            obj = json.loads(data)
        except ValueError:
            continue
        if isinstance(obj, dict):
            out.append(obj)
    return out, done


def _has_token(event: Mapping[str, Any]) -> bool:
    choices = event.get("choices")
    if not isinstance(choices, list) or not choices or not isinstance(choices[0], dict):
        return False
    choice = choices[0]
    if choice.get("finish_reason"):
        return True
    delta = choice.get("delta")
    if isinstance(delta, dict) and delta.get("content"):
        return True
    return bool(choice.get("text"))


async def open_stream(
    client: httpx.AsyncClient,
    url: str,
    payload: bytes,
    headers: Mapping[str, str],
    deadline_s: float,
) -> Primed:
    """POST ``payload`` and read until the first token; raise a :class:`ServeError` otherwise."""
    start = time.perf_counter()
    response: httpx.Response | None = None
    try:
        async with asyncio.timeout(deadline_s):
            request = client.build_request("POST", url, content=payload, headers=headers)
            response = await client.send(request, stream=True)
            if response.status_code != 200:
                raise await _error_from_response(response)
            chunks = response.aiter_raw()
            decoder = SSEDecoder()
            head = b""
            pending = b""
            events: list[dict[str, Any]] = []
            async for chunk in chunks:
                complete, pending = split_events(pending + chunk)
                if not complete:
                    continue
                head += complete
                new, done = parse_events(decoder, complete)
                events += new
                for event in new:
                    if isinstance(event.get("error"), dict):
                        raise error_from_body(502, event)
                if done or any(_has_token(e) for e in new):
                    ttft = time.perf_counter() - start
                    return Primed(url, response, chunks, head, events, ttft, done, pending, decoder)
            raise UpstreamUnavailable(f"upstream {url} ended the stream before the first token")
    except BaseException as exc:
        if response is not None:
            await response.aclose()
        if isinstance(exc, asyncio.CancelledError):
            raise
        if isinstance(exc, TimeoutError):
            raise UpstreamTimeout(
                f"upstream {url} sent no first token within {deadline_s:g}s"
            ) from None
        if isinstance(exc, Exception):
            raise translate_error(exc, url) from None
        raise
