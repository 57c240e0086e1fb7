"""Asking an instance whether it is up, over real HTTP: each answer, each way of not answering."""

from __future__ import annotations

import logging
import socket
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from pydantic import SecretStr
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, RedirectResponse, Response
from starlette.routing import Route

from hybrid_llm.local.servers import UvicornThread, free_port
from servekit.errors import UpstreamError, UpstreamTimeout, UpstreamUnavailable
from servekit.health_probe import probe_health
from servekit.peers import PeerProblems, PeerSettings, async_client
from tests.support.pki import PrivateCA

pytestmark = pytest.mark.anyio


async def _health(request: Request) -> Response:
    return PlainTextResponse("ok")


async def _loading(request: Request) -> Response:
    return JSONResponse({"error": {"message": "loading"}}, 503, {"Retry-After": "5"})


async def _guarded(request: Request) -> Response:
    if request.headers.get("authorization") != "Bearer fleet-token":
        return JSONResponse({"error": {"message": "no key"}}, status_code=401)
    return PlainTextResponse("ok")


async def _moved(request: Request) -> Response:
    return RedirectResponse("/health")


APP = Starlette(
    routes=[
        Route("/health", _health),
        Route("/ready", _loading),
        Route("/guarded/ready", _guarded),
        Route("/moved", _moved),
    ]
)


@pytest.fixture(scope="module")
def server() -> Iterator[str]:
    with UvicornThread(APP) as running:
        yield running.url


@pytest.fixture
def silent() -> Iterator[str]:
    """A port that accepts connections (the kernel's backlog) and never answers."""
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(8)
        yield f"http://127.0.0.1:{listener.getsockname()[1]}"


async def test_a_200_is_up(server: str) -> None:
    async with httpx.AsyncClient(timeout=5.0) as client:
        health = await probe_health(client, server + "/health")
    assert health.up
    assert (health.status, health.reason, health.failure) == (200, "HTTP 200", None)


@pytest.mark.parametrize(("path", "status"), [("/ready", 503), ("/nowhere", 404), ("/moved", 307)])
async def test_any_other_answer_is_not_up(server: str, path: str, status: int) -> None:
    async with httpx.AsyncClient(timeout=5.0) as client:
        health = await probe_health(client, server + path)
    assert not health.up
    assert (health.status, health.reason, health.failure) == (status, f"HTTP {status}", None)


async def test_the_token_rides_on_the_client_and_a_refusal_is_warned_once(
    server: str, caplog: pytest.LogCaptureFixture
) -> None:
    peer = async_client(PeerSettings(token=SecretStr("fleet-token")), timeout=5.0)
    async with peer, httpx.AsyncClient(timeout=5.0) as bare:
        assert (await probe_health(peer, server + "/guarded/ready")).up
        problems = PeerProblems(logging.getLogger("probe-test"))
        with caplog.at_level(logging.WARNING):
            for _ in range(3):
                health = await probe_health(bare, server + "/guarded/ready", problems=problems)
    assert (health.up, health.status) == (False, 401)
    warned = [r.getMessage() for r in caplog.records if r.name == "probe-test"]
    assert warned == [f"{server}/guarded/ready refused the service token (HTTP 401)"]


async def test_nobody_listening_is_refused_and_keeps_the_cause() -> None:
    async with httpx.AsyncClient(timeout=5.0) as client:
        health = await probe_health(client, f"http://127.0.0.1:{free_port()}/health")
    assert (health.up, health.status, health.reason) == (False, None, "refused")
    assert isinstance(health.failure, UpstreamUnavailable)
    assert isinstance(health.failure.__cause__, httpx.ConnectError)


async def test_silence_is_a_timeout_and_the_call_may_set_its_own(silent: str) -> None:
    async with httpx.AsyncClient(timeout=0.2) as client:
        health = await probe_health(client, silent + "/health")  # the client's timeout
    assert (health.up, health.status, health.reason) == (False, None, "timeout")
    assert isinstance(health.failure, UpstreamTimeout)
    async with httpx.AsyncClient(timeout=30.0) as client:
        health = await probe_health(client, silent + "/health", timeout_s=0.2)
    assert (health.status, health.reason) == (None, "timeout")


async def test_a_url_that_does_not_parse_is_no_answer_not_a_crash() -> None:
    async with httpx.AsyncClient(timeout=5.0) as client:
        health = await probe_health(client, "http://a\x00b/health")
    assert (health.up, health.status) == (False, None)
    assert isinstance(health.failure, UpstreamError)
    assert health.reason.startswith("InvalidURL: ")


async def test_a_certificate_for_another_name_is_a_tls_reason_warned_once(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    ca = PrivateCA(tmp_path)
    issued = ca.issue("edge.invalid")  # not 127.0.0.1, where we call it
    tls = {"ssl_certfile": str(issued.cert_file), "ssl_keyfile": str(issued.key_file)}
    problems = PeerProblems(logging.getLogger("probe-test"))
    with UvicornThread(APP, **tls) as running:
        assert running.url.startswith("https://")
        async with async_client(PeerSettings(ca_file=ca.ca_file), timeout=5.0) as client:
            with caplog.at_level(logging.WARNING):
                for _ in range(3):
                    health = await probe_health(client, running.url + "/health", problems=problems)
    assert (health.up, health.status) == (False, None)
    assert health.reason.startswith("TLS certificate verification failed"), health.reason
    assert isinstance(health.failure, UpstreamUnavailable)
    warned = [r.getMessage() for r in caplog.records if r.name == "probe-test"]
    assert len(warned) == 1, warned
    assert health.reason in warned[0]
