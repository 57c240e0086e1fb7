"""One way to talk to an upstream: the transport seam, its failures, its error answers.

The router and the central gateway reach OpenAI-compatible upstreams through
this module and ``servekit.sse.EventReader`` alone:

* :class:`Transport` is the seam, two methods as in httpx: ``post`` a body
  and get the response once its head arrived, ``close`` the connections.
  ``servekit.http_client.UpstreamPool`` is the data-path implementation.
* :func:`map_failure` is the one map from foreign failures (the lean pool's,
  httpx's, the OS's, timeouts) onto the error tree (``servekit.errors``):

      could not connect (refused, unreachable, TLS, connect timeout)
                            → 503 upstream_unavailable  (nothing was sent)
      no byte in time       → 504 timeout
      broke off or malformed → 502 upstream_disconnected
      (all three retryable: another instance may answer)

* :func:`error_from_response` reads an upstream's non-200 answer, its
  ``Retry-After`` kept on the error so the caller backs off for that long.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Mapping
from typing import Any, Protocol

import httpx

from servekit.errors import (
    ServeError,
    UpstreamError,
    error_from_body,
    parse_retry_after,
    upstream_failure,
)
from servekit.http_client import ConnectError, HTTPClientError
from servekit.peers import PeerCredentials

__all__ = [
    "FAILURES",
    "UNREACHED",
    "Transport",
    "UpstreamResponse",
    "error_from_response",
    "map_failure",
]

# What talking to an upstream may raise besides project errors.
FAILURES = (HTTPClientError, httpx.HTTPError, OSError, TimeoutError)
# What a GET to an instance URL may raise: a URL a registry listed may not even parse
# (httpx.InvalidURL is no HTTPError); as unreachable as a refused one.
UNREACHED = (*FAILURES, httpx.InvalidURL)


class UpstreamResponse(Protocol):
    """A response whose head arrived."""

    @property
    def status(self) -> int: ...

    @property
    def headers(self) -> Mapping[str, str]:
        """Lower-case names."""
        ...

    def chunks(self) -> AsyncIterator[bytes]: ...

    async def read(self) -> bytes: ...

    def flowing(self) -> None:
        """The first token arrived: from now on silence past the read timeout is an
        error (the wait before it, a prefill, is the caller's to bound)."""

    def release(self) -> None:
        """Done with it: the connection is reused if the body was read out."""

    def close(self) -> None:
        """Abandon it: the connection is closed."""


class Transport(Protocol):
    async def post(
        self,
        url: str,
        payload: bytes,
        headers: Mapping[str, str],
        peer: PeerCredentials | None = None,
    ) -> UpstreamResponse:
        """Send ``payload``; return once the response head arrived."""
        ...

    async def close(self) -> None: ...


def map_failure(exc: BaseException, where: str) -> ServeError:
    """The one mapping from a failed exchange with an upstream to the error tree."""
    if isinstance(exc, ServeError):
        return exc
    if isinstance(exc, ConnectError):
        return upstream_failure("connect", where, exc.reason)
    if isinstance(exc, httpx.ConnectError | httpx.ConnectTimeout):
        return upstream_failure("connect", where, str(exc) or type(exc).__name__)
    if isinstance(exc, TimeoutError | httpx.TimeoutException):
        return upstream_failure("timeout", where, "no byte within the read timeout")
    if isinstance(exc, HTTPClientError | OSError | httpx.TransportError):
        return upstream_failure("broken", where, str(exc) or repr(exc))
    return UpstreamError(f"upstream {where} failed: {type(exc).__name__}: {exc}")


def error_from_response(status: int, raw: bytes, retry_after: str | None, where: str) -> ServeError:
    """An upstream's non-200 answer as a project error (``Retry-After`` kept on it)."""
    if status in (401, 403):
        # Our credentials, not the client's: say so, and let another instance
        # answer (a client must never see this as "invalid API key").
        return UpstreamError(
            f"upstream {where} refused our service token (HTTP {status}); "
            "check the peer credentials (peers.<tier>.token)"
        )
    try:
        body: Any = json.loads(raw) if raw else None
    except ValueError:
        body = None
    return error_from_body(status, body, retry_after=parse_retry_after(retry_after))
