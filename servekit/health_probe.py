"""Ask an instance whether it is up: one GET, its failures mapped once.

Every "is it alive?" and "is it ready?" the services ask comes through
:func:`probe_health`: the static registry's ``/ready`` poll, the OpenAI-HTTP
engine's health check, the vLLM engine's ``/health`` (while it starts and
while it runs), the central gateway's replica checks and the local
topology's wait for its services. Its sibling :mod:`servekit.load_reading`
asks for the load.

The caller owns the ``httpx.AsyncClient``, so what an instance requires of
a caller (the service token, the CA bundle, ``require_tls``) rides on it
(:func:`servekit.peers.async_client`). The timeout is the client's unless
the call gives one.

A probe never raises for the instance's sake; it returns a :class:`Health`::

    answered 200             up                  reason "HTTP 200"
    answered anything else   not up, ``status``  reason "HTTP 503"
    no answer                not up, ``status``  ``failure``: what map_failure makes of
                             None                it (503 could not connect, 504 timed
                                                 out, 502 broke off), cause kept;
                                                 reason "refused", "timeout", the
                                                 TLS failure, or what broke

Only 200 is up: a redirect, a 204 or a 503 while loading are all "not up"
(every probe here has always read it so). With ``problems`` the
configuration mistakes a probe reveals (a refused certificate, a refused
token) are logged once (:class:`servekit.peers.PeerProblems`).
"""

from __future__ import annotations

from dataclasses import dataclass

import httpx

from servekit.errors import ServeError, UpstreamTimeout, UpstreamUnavailable
from servekit.peers import PeerProblems
from servekit.secrets import redact_url
from servekit.tls import describe_tls_error
from servekit.transport import UNREACHED, map_failure

__all__ = ["Health", "probe_health"]


@dataclass(frozen=True, slots=True)
class Health:
    """What one probe learned."""

    status: int | None  # the HTTP status it answered; None: no answer
    reason: str  # for logs, without the URL: "HTTP 503", "refused", "timeout", ...
    failure: ServeError | None = None  # no answer: why, on the error tree

    @property
    def up(self) -> bool:
        return self.status == 200


async def probe_health(
    client: httpx.AsyncClient,
    url: str,
    *,
    timeout_s: float | None = None,
    problems: PeerProblems | None = None,
) -> Health:
    """``GET url``: up when it answers 200. Never raises for the instance's sake."""
    where = redact_url(url)
    timeout = httpx.USE_CLIENT_DEFAULT if timeout_s is None else timeout_s
    try:
        response = await client.get(url, timeout=timeout)
    except UNREACHED as exc:
        failure = map_failure(exc, where)
        failure.__cause__ = exc  # a TLS or OS reason stays findable (exc is never a ServeError)
        if problems is not None:
            problems.failed(where, exc)
        return Health(None, _unreached_reason(exc, failure), failure)
    if problems is not None:
        problems.status(where, response.status_code)
    return Health(response.status_code, f"HTTP {response.status_code}")


def _unreached_reason(exc: BaseException, failure: ServeError) -> str:
    tls = describe_tls_error(exc)
    if tls is not None:
        return tls
    if _caused_by(exc, ConnectionRefusedError):
        return "refused"
    if isinstance(failure, UpstreamTimeout) or _caused_by(exc, httpx.TimeoutException):
        return "timeout"
    detail = str(exc) or type(exc).__name__
    if isinstance(failure, UpstreamUnavailable):
        return f"cannot connect: {detail}"
    if failure.code == "upstream_disconnected":
        return f"broke off: {detail}"
    return f"{type(exc).__name__}: {detail}"  # e.g. a URL that does not parse


def _caused_by(exc: BaseException, kind: type[BaseException]) -> bool:
    seen: BaseException | None = exc
    for _ in range(8):  # httpx wraps httpcore's error, which wraps the OS one
        if seen is None:
            return False
        if isinstance(seen, kind):
            return True
        seen = seen.__cause__ or seen.__context__
    return False
