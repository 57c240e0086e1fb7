"""Reading an instance's load over real HTTP: each way a read fails, mapped onto the error tree."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import httpx
import pytest
from pydantic import SecretStr
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, Response
from starlette.routing import Route

from hybrid_llm.local.servers import UvicornThread, free_port
from servekit.engine.protocol import LoadReport
from servekit.engine.vllm_metrics import parse_vllm_metrics
from servekit.errors import UpstreamError, UpstreamTimeout, UpstreamUnavailable
from servekit.load_reading import LoadNotReported, read_load_page, read_load_report
from servekit.peers import PeerSettings, async_client
from servekit.rtt import MeasuredRtt

pytestmark = pytest.mark.anyio

REPORT = LoadReport(ready=True, waiting=3, running=2, capacity=4)


async def _load(request: Request) -> Response:
    if request.headers.get("authorization") != "Bearer fleet-token":
        return JSONResponse({"error": {"message": "no key"}}, status_code=401)
    return JSONResponse(REPORT.to_dict())


async def _crashed(request: Request) -> Response:
    return PlainTextResponse("Internal Server Error", status_code=500)


async def _draining(request: Request) -> Response:
    return JSONResponse({"error": {"message": "draining"}}, 503, {"Retry-After": "7"})


async def _garbage(request: Request) -> Response:
    return Response(b"{not json", media_type="application/json")


async def _a_list(request: Request) -> Response:
    return JSONResponse([1, 2])


async def _slow(request: Request) -> Response:
    await asyncio.sleep(1.0)
    return JSONResponse(REPORT.to_dict())


async def _metrics(request: Request) -> Response:
    text = "vllm:num_requests_running 5.0\nvllm:num_requests_waiting 1.0\n"
    return PlainTextResponse(text)


APP = Starlette(
    routes=[
        Route("/load", _load),
        Route("/crashed/load", _crashed),
        Route("/draining/load", _draining),
        Route("/garbage/load", _garbage),
        Route("/list/load", _a_list),
        Route("/slow/load", _slow),
        Route("/metrics", _metrics),
    ]
)


@pytest.fixture(scope="module")
def server() -> Iterator[str]:
    with UvicornThread(APP) as running:
        yield running.url


def _peer_client(timeout_s: float = 5.0) -> httpx.AsyncClient:
    return async_client(PeerSettings(token=SecretStr("fleet-token")), timeout=timeout_s)


async def test_the_report_is_read_with_the_peer_credentials(server: str) -> None:
    async with _peer_client() as client:
        assert await read_load_report(client, server + "/") == REPORT


async def test_a_refused_token_is_an_answer_without_a_load(server: str) -> None:
    async with httpx.AsyncClient(timeout=5.0) as client:
        with pytest.raises(LoadNotReported) as caught:
            await read_load_report(client, server)
    assert caught.value.answered == 401
    assert (caught.value.status, caught.value.retryable) == (502, True)
    assert "refused our service token" in caught.value.message


@pytest.mark.parametrize(
    ("where", "answered", "says"),
    [
        ("/crashed", 500, "HTTP 500"),
        ("/garbage", 200, "unreadable load"),
        ("/list", 200, "must be a JSON object"),
        ("/nowhere", 404, "HTTP 404"),
    ],
)
async def test_an_answer_without_a_load(server: str, where: str, answered: int, says: str) -> None:
    async with _peer_client() as client:
        with pytest.raises(LoadNotReported) as caught:
            await read_load_report(client, server + where)
    assert caught.value.answered == answered
    assert says in caught.value.message


async def test_a_refusal_keeps_its_retry_after(server: str) -> None:
    async with _peer_client() as client:
        with pytest.raises(LoadNotReported) as caught:
            await read_load_report(client, server + "/draining")
    assert (caught.value.answered, caught.value.retry_after) == (503, 7.0)


async def test_a_timeout_is_a_504_and_the_call_may_set_its_own(server: str) -> None:
    async with _peer_client(timeout_s=0.2) as client:
        with pytest.raises(UpstreamTimeout):
            await read_load_report(client, server + "/slow")  # the client's timeout
        assert await read_load_report(client, server + "/slow", timeout_s=5.0) == REPORT
    async with _peer_client(timeout_s=5.0) as client:
        with pytest.raises(UpstreamTimeout):
            await read_load_report(client, server + "/slow", timeout_s=0.2)


async def test_nobody_listening_is_unavailable_and_keeps_the_cause() -> None:
    async with _peer_client() as client:
        with pytest.raises(UpstreamUnavailable) as caught:
            await read_load_report(client, f"http://127.0.0.1:{free_port()}")
        with pytest.raises(UpstreamUnavailable):
            await read_load_report(client, "http://[not a host")
        with pytest.raises(UpstreamError) as unparsed:
            await read_load_report(client, "http://a\x00b")  # httpx.InvalidURL: no HTTPError
    assert isinstance(caught.value.__cause__, httpx.ConnectError)  # a TLS reason stays findable
    assert not isinstance(unparsed.value, LoadNotReported)  # unreached, not an answer


async def test_another_format_goes_through_its_own_parser(server: str) -> None:
    async with _peer_client() as client:
        gauges = await read_load_page(
            client, server + "/metrics", lambda r: parse_vllm_metrics(r.text)
        )
    assert (gauges.running, gauges.waiting) == (5, 1)


async def test_an_answered_read_times_the_round_trip_and_a_refused_one_does_not(
    server: str,
) -> None:
    rtt = MeasuredRtt()
    async with _peer_client() as client:
        with pytest.raises(LoadNotReported):
            await read_load_report(client, server + "/draining", rtt=rtt)
        assert rtt.ms is None  # answered, but without a load: no sample
        await read_load_report(client, server + "/slow", rtt=rtt)
    assert rtt.ms is not None
    assert rtt.ms >= 1000.0  # the page answers after a second
