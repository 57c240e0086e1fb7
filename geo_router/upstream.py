"""Talking to one upstream: open a stream primed with its first token.

The data path uses the router's own lean HTTP/1.1 client
(``geo_router.http_client``): on this hop every microsecond before the first
byte is router-added latency, and a general client's per-request machinery
costs several hundred of them when the request runs on cold caches.
:func:`translate_error` is the one place transport exceptions become project
errors (``servekit.errors``).

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

from geo_router.http_client import ConnectError, HTTPClientError, Response, UpstreamPool
from servekit.errors import (
    ServeError,
    UpstreamError,
    error_from_body,
    parse_retry_after,
    upstream_failure,
)
from servekit.peers import PeerCredentials
from servekit.sse import DONE, SSEDecoder

__all__ = [
    "TRANSPORT_ERRORS",
    "Primed",
    "no_first_token",
    "open_stream",
    "split_events",
    "translate_error",
]

# What reading an upstream may raise besides project errors.
TRANSPORT_ERRORS = (HTTPClientError, OSError, TimeoutError)


def translate_error(exc: BaseException, url: str) -> ServeError:
    """The one mapping from transport failures (and timeouts) to the project's error tree."""
    if isinstance(exc, ServeError):
        return exc
    if isinstance(exc, ConnectError):
        return upstream_failure("connect", url, exc.reason)
    if isinstance(exc, TimeoutError):
        return upstream_failure("timeout", url, "no byte within the read timeout")
    if isinstance(exc, HTTPClientError | OSError):
        return upstream_failure("broken", url, repr(exc))
    return UpstreamError(f"upstream {url} failed: {type(exc).__name__}: {exc}")


async def _error_from_response(resp: Response, url: str) -> ServeError:
    if resp.status in (401, 403):
        # The router's credentials, not the client's: say so, and let another
        # instance answer (a client must never see this as "invalid API key").
        resp.close()
        return UpstreamError(
            f"upstream {url} refused the router's service token (HTTP {resp.status}); "
            "check peers.<tier>.token"
        )
    raw = await resp.read()
    try:
        body: Any = json.loads(raw) if raw else None
    except ValueError:
        body = None
    retry = parse_retry_after(resp.headers.get("retry-after"))
    return error_from_body(resp.status, body, retry_after=retry)


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
    response: Response
    chunks: AsyncIterator[bytes]
    head: bytes
    events: list[dict[str, Any]]
    ttft_s: float
    done: bool = False
    rest: bytes = b""
    decoder: SSEDecoder = field(default_factory=SSEDecoder)

    async def aclose(self) -> None:
        """Abandon the stream (the connection is closed, not reused)."""
        self.response.close()

    async def finish(self, timeout_s: float = 1.0) -> None:
        """After ``[DONE]``: read the transfer's tail so the connection is reused."""
        try:
            async with asyncio.timeout(timeout_s):
                async for _ in self.chunks:
                    pass
        except TRANSPORT_ERRORS:
            self.response.close()
            return
        self.response.release()


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


def no_first_token(url: str, deadline_s: float) -> ServeError:
    """The error of an attempt that missed its first-token deadline (504, retryable)."""
    return upstream_failure("timeout", url, f"no first token within {deadline_s:g}s")


async def open_stream(
    pool: UpstreamPool,
    url: str,
    payload: bytes,
    headers: Mapping[str, str],
    deadline_s: float,
    peer: PeerCredentials | None = None,
) -> Primed:
    """POST ``payload`` and read until the first token; raise a :class:`ServeError` otherwise."""
    start = time.perf_counter()
    response: Response | None = None
    try:
        async with asyncio.timeout(deadline_s):
            response = await pool.post(url, payload, headers, peer)
            if response.status != 200:
                raise await _error_from_response(response, url)
            chunks = response.chunks()
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
                    response.flowing()  # silence is timed from the first token on
                    ttft = time.perf_counter() - start
                    return Primed(url, response, chunks, head, events, ttft, done, pending, decoder)
            raise upstream_failure("broken", url, "the stream ended before the first token")
    except BaseException as exc:
        if response is not None:
            response.close()
        if isinstance(exc, asyncio.CancelledError):
            raise
        if isinstance(exc, TimeoutError):
            raise no_first_token(url, deadline_s) from None
        if isinstance(exc, Exception):
            raise translate_error(exc, url) from None
        raise
