"""Ask an instance what it carries: one GET, its failures mapped once.

Every reader of an instance's load comes through here: the router's live
load and its static entries, the OpenAI-HTTP engine, the central gateway's
replicas and the vLLM engine. :func:`read_load_report` reads the project's
own ``GET <base>/load`` (every service serves it: the :class:`LoadReport`
its heartbeats carry); :func:`read_load_page` reads any other page with a
parser of its format (vLLM's Prometheus text,
:mod:`servekit.engine.vllm_metrics`; trtllm-serve's iteration stats,
``central.scrape``).

The caller owns the ``httpx.AsyncClient``, so what an instance requires of
a caller (the service token, the CA bundle, ``require_tls``) rides on it
(:func:`servekit.peers.async_client`). The timeout is the client's unless
the call gives one.

A read that brings no load raises, mapped once onto the error tree
(``servekit.errors``)::

    not reached, timed out, broke off   map_failure: UpstreamUnavailable (503),
                                        UpstreamTimeout (504), UpstreamError (502)
    answered without a load             LoadNotReported (502), ``answered`` the
      (not 200, or a body its parser      HTTP status: 401/403 our token refused,
       cannot read)                       404 no such page, 200 an unreadable body
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any, TypeVar

import httpx

from servekit.engine.protocol import LoadReport
from servekit.errors import UpstreamError
from servekit.rtt import MeasuredRtt
from servekit.secrets import redact_url
from servekit.transport import UNREACHED, error_from_response, map_failure

__all__ = ["LoadNotReported", "load_report_from", "read_load_page", "read_load_report"]

T = TypeVar("T")


class LoadNotReported(UpstreamError):
    """The instance answered, but not with a load (``answered``: its HTTP status)."""

    default_code = "load_not_reported"

    def __init__(self, message: str, answered: int, *, retry_after: float | None = None) -> None:
        super().__init__(message, retry_after=retry_after)
        self.answered = answered


async def read_load_page(
    client: httpx.AsyncClient,
    url: str,
    parse: Callable[[httpx.Response], T],
    *,
    timeout_s: float | None = None,
) -> T:
    """``GET url`` and ``parse`` its 200 answer (a ``ValueError``, ``TypeError`` or
    ``KeyError`` from it: an unreadable body). Raises as the module says."""
    where = redact_url(url)
    timeout = httpx.USE_CLIENT_DEFAULT if timeout_s is None else timeout_s
    try:
        response = await client.get(url, timeout=timeout)
    except UNREACHED as exc:
        raise map_failure(exc, where) from exc
    status = response.status_code
    if status != 200:
        refusal = error_from_response(
            status, response.content, response.headers.get("retry-after"), where
        )
        raise LoadNotReported(
            f"{where} answered HTTP {status}: {refusal.message}",
            status,
            retry_after=refusal.retry_after,
        )
    try:
        return parse(response)
    except (ValueError, TypeError, KeyError) as exc:
        raise LoadNotReported(f"{where} answered an unreadable load: {exc}", status) from exc


def load_report_from(response: httpx.Response) -> LoadReport:
    """The project's ``/load`` body: a JSON object of :class:`LoadReport`'s fields."""
    data: Any = response.json()
    if not isinstance(data, dict):
        raise ValueError("/load must be a JSON object")
    return LoadReport.from_dict(data)


async def read_load_report(
    client: httpx.AsyncClient,
    base_url: str,
    *,
    path: str = "/load",
    timeout_s: float | None = None,
    rtt: MeasuredRtt | None = None,
) -> LoadReport:
    """The instance's own report, ``GET <base_url><path>``; with ``rtt``, the time
    an answered read took is added to it (the reader's round trip to the instance)."""
    url = base_url.rstrip("/") + path
    sent = time.perf_counter()
    report = await read_load_page(client, url, load_report_from, timeout_s=timeout_s)
    if rtt is not None:
        rtt.add((time.perf_counter() - sent) * 1000.0)
    return report
