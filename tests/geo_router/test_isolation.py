"""What the router forwards is its own: the output budget always written and capped,
request ids it makes (the client's kept apart), against a real fake upstream."""

from __future__ import annotations

import asyncio
import json
import socket
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import httpx
import pytest
from asgi_lifespan import LifespanManager

from geo_router.app import create_app
from geo_router.bodycheck import capped_max_tokens
from geo_router.request_ids import client_request_id, new_request_id
from geo_router.settings import RouterSettings
from hybrid_llm.local.servers import UvicornThread, wait_until
from servekit.connection_guard import ConnectionLimits, guarded_protocol
from tests.geo_router.conftest import BATCH_KEY, KEY, router_settings, serve_fake, upstream
from tests.geo_router.fake_upstream import Behavior

pytestmark = pytest.mark.anyio

CHAT = {"model": "auto", "messages": [{"role": "user", "content": "hello there"}]}


@asynccontextmanager
async def router(settings: RouterSettings) -> AsyncIterator[httpx.AsyncClient]:
    app = create_app(settings)
    async with LifespanManager(app) as manager:
        transport = httpx.ASGITransport(app=manager.app, client=("127.0.0.1", 5555))
        async with httpx.AsyncClient(transport=transport, base_url="http://router") as client:
            yield client


def _keys(**limits: Any) -> list[dict[str, Any]]:
    """The test router's keys, the first one (``KEY``'s) with ``limits``."""
    keys: list[dict[str, Any]] = router_settings([]).auth.model_dump()["keys"]
    keys[0].update(limits)
    return keys


async def test_max_tokens_is_always_forwarded_and_capped(auth: dict[str, str]) -> None:
    edge = Behavior()
    routing = {"default_max_tokens": 200, "max_tokens_cap": 1000}
    with serve_fake(edge) as url:
        async with router(router_settings([upstream(url)], routing=routing)) as c:
            for extra in ({}, {"max_tokens": 50_000}, {"max_completion_tokens": 9_999}):
                r = await c.post("/v1/chat/completions", json={**CHAT, **extra}, headers=auth)
                assert r.status_code == 200, r.text
            r = await c.post("/v1/completions", json={"model": "auto", "prompt": "x"}, headers=auth)
            assert r.status_code == 200, r.text
    sent = [s["body"] for s in edge.seen]
    assert sent[0]["max_tokens"] == 200  # engines default to the rest of the window
    assert sent[1]["max_tokens"] == 1000
    assert sent[2]["max_completion_tokens"] == 1000
    assert sent[3]["max_tokens"] == 200


async def test_the_token_limit_charges_what_is_forwarded(auth: dict[str, str]) -> None:
    keys = _keys(tpm=1000, burst_s=60)
    edge = Behavior(words=10_000)  # every answer runs to its budget
    routing = {"default_max_tokens": 300, "max_tokens_cap": 400}
    with serve_fake(edge) as url:
        settings = router_settings([upstream(url)], auth={"keys": keys}, routing=routing)
        async with router(settings) as c:
            codes = []
            for _ in range(4):  # a capped 50,000 costs 400, as forwarded: two fit in 1000
                body = {**CHAT, "max_tokens": 50_000, "stream": True}
                codes.append(
                    (await c.post("/v1/chat/completions", json=body, headers=auth)).status_code
                )
    assert codes == [200, 200, 429, 429]


async def test_a_stream_that_asks_no_usage_is_settled_from_the_usage_it_never_sees(
    auth: dict[str, str],
) -> None:
    """The router asks every upstream for usage; a client that did not gets none, and its
    tokens are settled all the same (it could avoid paying for an under-counted prompt
    by streaming without ``include_usage``)."""
    keys = _keys(tpm=1000, burst_s=60)
    edge = Behavior(words=4, prompt_tokens=900)
    routing = {"default_max_tokens": 10, "max_tokens_cap": 10}
    with serve_fake(edge) as url:
        settings = router_settings([upstream(url)], auth={"keys": keys}, routing=routing)
        async with router(settings) as c:
            answers = []
            for _ in range(3):
                body = {**CHAT, "stream": True}
                answers.append(await c.post("/v1/chat/completions", json=body, headers=auth))
    assert [a.status_code for a in answers] == [200, 200, 429]
    assert all(s["body"]["stream_options"] == {"include_usage": True} for s in edge.seen)
    stream = answers[0].text
    assert '"usage"' not in stream
    assert '"finish_reason":"stop"' in stream.replace(" ", "")
    assert stream.endswith("data: [DONE]\n\n")


async def test_the_token_limit_gives_back_what_the_usage_shows_unused(
    auth: dict[str, str],
) -> None:
    """Charged the capped budget at intake, settled from ``usage`` afterwards: an 8-word
    answer of a 400-token budget leaves the rest of the bucket to the tenant."""
    keys = _keys(tpm=1000, burst_s=60)
    edge = Behavior(words=8)
    routing = {"default_max_tokens": 300, "max_tokens_cap": 400}
    with serve_fake(edge) as url:
        settings = router_settings([upstream(url)], auth={"keys": keys}, routing=routing)
        async with router(settings) as c:
            answers = []
            for stream in (False, False, True, False, False):
                body = {**CHAT, "max_tokens": 50_000, "stream": stream}
                if stream:
                    body["stream_options"] = {"include_usage": True}
                answers.append(await c.post("/v1/chat/completions", json=body, headers=auth))
    assert [a.status_code for a in answers] == [200] * 5  # 5 x 400 charged > 1000
    assert answers[0].json()["usage"]["completion_tokens"] == 8


async def test_a_prompt_the_estimate_under_counts_is_charged_from_its_usage(
    auth: dict[str, str],
) -> None:
    """The intake charge is an estimate: a prompt the engine counts at 900 tokens while the
    estimator saw a handful cost the tenant a handful until the usage was settled both ways."""
    keys = _keys(tpm=1000, burst_s=60)
    edge = Behavior(words=4, prompt_tokens=900)
    routing = {"default_max_tokens": 10, "max_tokens_cap": 10}
    with serve_fake(edge) as url:
        settings = router_settings([upstream(url)], auth={"keys": keys}, routing=routing)
        async with router(settings) as c:
            codes = []
            for _ in range(3):
                r = await c.post("/v1/chat/completions", json=CHAT, headers=auth)
                codes.append(r.status_code)
    assert codes == [200, 200, 429]  # 904 a request: the second leaves the bucket below 0
    assert r.json()["error"]["code"] == "tokens_rate_limit_exceeded"


async def test_a_clients_request_id_is_never_the_requests_id(auth: dict[str, str]) -> None:
    edge = Behavior()
    with serve_fake(edge) as url:
        async with router(router_settings([upstream(url)])) as c:
            headers = {**auth, "X-Request-Id": "victim-123"}
            first = await c.post("/v1/chat/completions", json=CHAT, headers=headers)
            second = await c.post("/v1/chat/completions", json=CHAT, headers=auth)
    assert first.status_code == second.status_code == 200
    sent = [s["headers"] for s in edge.seen]
    assert sent[0]["x-request-id"] != "victim-123"
    assert sent[0]["x-client-request-id"] == "victim-123"
    assert "x-client-request-id" not in sent[1]
    assert first.headers["x-request-id"] == sent[0]["x-request-id"]
    assert first.headers["x-client-request-id"] == "victim-123"
    ids = [first.headers["x-request-id"], second.headers["x-request-id"]]
    assert ids[0] != ids[1]
    # Nothing shared beyond the fixed "req-": no per-process prefix, no visible counter.
    assert ids[0][:8] != ids[1][:8] or ids[0][-8:] != ids[1][-8:]


def test_ids_are_unique_and_carry_no_counter() -> None:
    ids = [new_request_id() for _ in range(2000)]
    assert len(set(ids)) == len(ids)
    assert all(i.startswith("req-") and len(i) == 28 for i in ids)
    assert len({i[4:10] for i in ids}) > 1900  # no common prefix


@pytest.mark.parametrize(
    ("value", "kept"),
    [("abc-123", True), ("a" * 128, True), ("a" * 129, False), ("a b", False), ("x\u00e9", False)],
)
def test_only_plain_client_ids_are_kept(value: str, kept: bool) -> None:
    assert (client_request_id({"x-request-id": value}) == value) is kept


@pytest.mark.parametrize(
    ("body", "budget", "forwarded"),
    [
        ({}, 256, {"max_tokens": 256}),
        ({"max_tokens": 10}, 10, {"max_tokens": 10}),
        ({"max_tokens": 10**6}, 4096, {"max_tokens": 4096}),
        (
            {"max_tokens": 10**6, "max_completion_tokens": 5},
            5,
            {"max_tokens": 4096, "max_completion_tokens": 5},
        ),
    ],
)
def test_capped_max_tokens(body: dict[str, Any], budget: int, forwarded: dict[str, Any]) -> None:
    assert capped_max_tokens(body, 256, 4096) == budget
    assert body == forwarded


async def test_routing_internals_are_for_operator_keys_only() -> None:
    # What an instance holds cached tells whether another tenant sent a text.
    operator = {"Authorization": f"Bearer {KEY}"}
    tenant = {"Authorization": f"Bearer {BATCH_KEY}"}
    with serve_fake(Behavior()) as url:
        async with router(router_settings([upstream(url)])) as c:
            r = await c.post("/v1/chat/completions", json=CHAT, headers=operator)
            assert r.status_code == 200, r.text
            assert "x-route-cached-tokens" in r.headers
            # What the prediction rested on: the rule, then the router's beliefs.
            rule, *beliefs = r.headers["x-route-prediction"].split("; ")
            assert rule == "quick"  # a short prompt on an idle instance: nothing to prefill
            assert [b.split("=")[0] for b in beliefs] == [
                "prompt_tokens", "cached_tokens", "wait_ms", "reported_wait_ms", "running",
                "rtt_ms", "ms_per_token",
            ]  # fmt: skip
            assert f"cached_tokens={r.headers['x-route-cached-tokens']}" in beliefs
            r = await c.post("/v1/chat/completions", json=CHAT, headers=tenant)
            assert r.status_code == 200, r.text
            assert "x-route-cached-tokens" not in r.headers
            assert "x-route-prediction" not in r.headers
            r = await c.post("/v1/route/explain", json=CHAT, headers=tenant)
            assert r.status_code == 403
            assert r.json()["error"]["type"] == "permission_error"
            assert "http://" not in r.text
            r = await c.post("/v1/route/explain", json=CHAT, headers=operator)
            assert r.status_code == 200
            assert r.json()["candidates"][0]["url"] == url


async def test_a_tenant_holds_at_most_max_streams_at_once(auth: dict[str, str]) -> None:
    keys = _keys(max_streams=1)
    slow = Behavior(words=4, token_delay_s=0.3)  # a stream that stays open ~1 s
    with serve_fake(slow) as url:
        settings = router_settings([upstream(url)], auth={"keys": keys})
        # A real socket: the in-process transport would read the stream out first.
        with UvicornThread(create_app(settings)) as srv:
            async with httpx.AsyncClient(base_url=srv.url, timeout=30) as c:
                body = {**CHAT, "stream": True}
                path = "/v1/chat/completions"
                async with c.stream("POST", path, json=body, headers=auth) as held:
                    assert held.status_code == 200
                    r = await c.post(path, json=CHAT, headers=auth)
                    assert r.status_code == 429, r.text
                    assert r.json()["error"]["code"] == "concurrency_limit_exceeded"
                    assert r.headers["retry-after"] == "1"
                    other = {"Authorization": f"Bearer {BATCH_KEY}"}  # another tenant
                    assert (await c.post(path, json=CHAT, headers=other)).is_success
                    await held.aread()
                r = await c.post(path, json=CHAT, headers=auth)
                assert r.status_code == 200, r.text  # the slot came back when it ended


async def test_a_reader_that_stops_reading_loses_its_stream_and_slot(auth: dict[str, str]) -> None:
    """A tenant that opens a stream and then reads nothing held its max_streams slot, the
    router's handler and the upstream stream for as long as it kept the socket open."""
    keys = _keys(max_streams=1)
    # Far more than the sockets between us hold; a pause per word (where a cancelled
    # stream notices: Starlette abandons a generator waiting at a yield).
    edge = Behavior(words=1_000_000, token_delay_s=0.0001)
    with serve_fake(edge) as url:
        routing = {"max_tokens_cap": 1_000_000}
        settings = router_settings([upstream(url)], auth={"keys": keys}, routing=routing)
        app = create_app(settings)
        guard = app.state.connection_guard  # as `geo-router serve` hands it over
        protocol = guarded_protocol(ConnectionLimits(send_stall_s=0.5), guard.closed)
        with UvicornThread(app, http=protocol) as srv:
            body = json.dumps({**CHAT, "stream": True, "max_tokens": 1_000_000}).encode()
            head = (
                f"POST /v1/chat/completions HTTP/1.1\r\nhost: r\r\n"
                f"authorization: {auth['Authorization']}\r\ncontent-type: application/json\r\n"
                f"content-length: {len(body)}\r\n\r\n"
            ).encode()
            with socket.socket() as sock:
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
                sock.connect(("127.0.0.1", srv.port))
                sock.sendall(head + body)
                assert sock.recv(1024).startswith(b"HTTP/1.1 200")
                # ... and never reads again, the socket held open.
                async with httpx.AsyncClient(base_url=srv.url, timeout=10) as c:
                    path = "/v1/chat/completions"
                    deadline = time.monotonic() + 20  # filling the buffers takes ~4 s
                    while True:
                        short = {**CHAT, "max_tokens": 8}
                        r = await c.post(path, json=short, headers=auth)
                        if r.status_code == 200 or time.monotonic() > deadline:
                            break
                        assert r.json()["error"]["code"] == "concurrency_limit_exceeded"
                        await asyncio.sleep(0.2)
                    assert r.status_code == 200, "the stalled reader still holds the slot"
                    # The upstream stream was cancelled, not read out.
                    await asyncio.to_thread(wait_until, lambda: edge.aborted == 1, 5, "abort")
                    metrics = (await c.get("/metrics")).text  # and the router counted it
                    stalls = 'hybrid_connections_closed_total{reason="send_stall"} 1.0'
                    assert stalls in metrics.splitlines()
