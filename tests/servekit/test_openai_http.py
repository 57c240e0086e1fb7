"""The OpenAI-HTTP engine: error translation and stream parsing through a scripted
transport, then over real sockets (the lean pool) and a real edge agent process."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Iterator
from typing import Any

import pytest

from hybrid_llm.local.servers import free_port, service_process
from servekit.engine.openai_http import OpenAIHTTPEngine, OpenAIHTTPSettings
from servekit.engine.protocol import (
    Finish,
    GenerationEvent,
    GenerationRequest,
    Message,
    Priority,
    SamplingParams,
    TextDelta,
)
from servekit.errors import (
    InvalidRequest,
    RateLimited,
    ServeError,
    UpstreamError,
    UpstreamTimeout,
    UpstreamUnavailable,
)
from servekit.http_client import ConnectError, ConnectionBroken
from tests.support.transport import FakeResponse, FakeTransport, unanswered_url

pytestmark = pytest.mark.anyio

REQ = GenerationRequest(
    "rid-1",
    SamplingParams(max_tokens=4, temperature=0.0, stop=("x",)),
    messages=(Message("user", "hi"),),
    priority=Priority.BATCH,
    extra={"top_k": 3},
)


def sse(*events: Any) -> bytes:
    out = b""
    for e in events:
        out += b"data: " + (e if isinstance(e, bytes) else json.dumps(e).encode()) + b"\n\n"
    return out


def chunk(text: str | None = None, finish: str | None = None) -> dict[str, Any]:
    delta = {"content": text} if text is not None else {}
    return {"choices": [{"index": 0, "delta": delta, "finish_reason": finish}]}


def engine_for(transport: FakeTransport, **settings: Any) -> OpenAIHTTPEngine:
    return OpenAIHTTPEngine(
        OpenAIHTTPSettings(
            base_url="http://upstream:9/v1", model="up-model", served_name="mine", **settings
        ),
        transport=transport,
        probe=None,
    )


def streamed(body: bytes) -> FakeResponse:
    return FakeResponse(200, [body], {"content-type": "text/event-stream"})


async def collect(engine: OpenAIHTTPEngine) -> list[GenerationEvent]:
    return [e async for e in engine.generate(REQ)]


async def test_request_shape_and_stream_parsing() -> None:
    body = sse(
        {"choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}}]},
        chunk("Hel"), chunk("lo"), chunk(None, "length"),
        {"choices": [], "usage": {"prompt_tokens": 7, "completion_tokens": 2,
                                  "prompt_tokens_details": {"cached_tokens": 3}}},
        b"[DONE]",
    )  # fmt: skip
    answer = streamed(body)
    transport = FakeTransport(answer)
    events = await collect(engine_for(transport))
    assert transport.urls == ["http://upstream:9/v1/chat/completions"]
    assert transport.headers[0]["x-request-id"] == "rid-1"
    assert transport.headers[0]["x-priority"] == "batch"
    assert answer.flowed  # silence is timed once the head arrived
    body = transport.sent[0]
    assert body["model"] == "up-model"
    assert body["stream"] is True
    assert body["stream_options"] == {"include_usage": True}
    assert body["max_tokens"] == 4
    assert body["stop"] == ["x"]
    assert body["top_k"] == 3
    assert body["messages"] == [{"role": "user", "content": "hi"}]
    assert events == [TextDelta("Hel", 1), TextDelta("lo", 1), Finish("length", 7, 2, 3)]


async def test_request_fields_are_the_services_setting() -> None:
    transport = FakeTransport(streamed(sse(chunk("a", "stop"), b"[DONE]")))
    fields = {"ignore_eos": True, "max_tokens": 999}
    [e async for e in engine_for(transport, request_fields=fields).generate(REQ)]
    bodies = transport.sent
    assert bodies[0]["ignore_eos"] is True
    assert bodies[0]["max_tokens"] == 4  # the request's own fields win


async def test_the_callers_cache_salt_is_sent_unless_the_upstream_refuses_it() -> None:
    transport = FakeTransport(*(streamed(sse(chunk("a", "stop"), b"[DONE]")) for _ in range(3)))
    salted = dataclasses.replace(REQ, cache_salt="s" * 64)
    [e async for e in engine_for(transport).generate(salted)]
    [e async for e in engine_for(transport).generate(REQ)]
    [e async for e in engine_for(transport, send_cache_salt=False).generate(salted)]
    assert [b.get("cache_salt") for b in transport.sent] == ["s" * 64, None, None]


@pytest.mark.parametrize(
    ("status", "payload", "headers", "cls"),
    [
        (400, {"error": {"message": "bad", "param": "max_tokens"}}, {}, InvalidRequest),
        (429, {"error": {"message": "busy"}}, {"retry-after": "3"}, RateLimited),
        (500, {"error": {"message": "boom"}}, {}, UpstreamError),
        (502, b"<html>bad gateway</html>", {}, UpstreamError),
        (503, {"error": {"message": "loading"}}, {}, UpstreamUnavailable),
    ],
)
async def test_upstream_status_becomes_project_error(
    status: int, payload: Any, headers: dict[str, str], cls: type[ServeError]
) -> None:
    content = payload if isinstance(payload, bytes) else json.dumps(payload).encode()
    with pytest.raises(cls) as info:
        await collect(engine_for(FakeTransport(FakeResponse(status, [content], headers))))
    if status == 429:
        assert info.value.retry_after == 3
    if status == 400:
        assert info.value.param == "max_tokens"


@pytest.mark.parametrize(
    ("exc", "cls"),
    [
        (ConnectError("http://upstream:9", ConnectionRefusedError("refused")), UpstreamUnavailable),
        (TimeoutError("slow"), UpstreamTimeout),
        (ConnectionBroken("reset"), UpstreamError),
    ],
)
async def test_transport_failures_are_translated(exc: Exception, cls: type[ServeError]) -> None:
    with pytest.raises(cls):
        await collect(engine_for(FakeTransport(exc)))
    # Mid-stream too, after the head arrived.
    with pytest.raises(cls):
        await collect(engine_for(FakeTransport(FakeResponse(200, [], then=exc))))
    # And while reading an error answer's body.
    with pytest.raises(cls):
        await collect(engine_for(FakeTransport(FakeResponse(503, [], then=exc))))


async def test_stream_cut_mid_way_is_an_upstream_error() -> None:
    events: list[GenerationEvent] = []
    with pytest.raises(UpstreamError) as info:
        async for e in engine_for(FakeTransport(streamed(sse(chunk("partial"))))).generate(REQ):
            events.append(e)
    assert events == [TextDelta("partial", 1)]
    assert info.value.code == "upstream_disconnected"


async def test_error_event_inside_stream() -> None:
    body = sse(chunk("a"), {"error": {"message": "engine died", "type": "x"}}, b"[DONE]")
    with pytest.raises(UpstreamError, match="engine died"):
        await collect(engine_for(FakeTransport(streamed(body))))


async def test_completion_path_and_continue_flags() -> None:
    def answer() -> FakeResponse:
        return streamed(sse({"choices": [{"text": "z", "finish_reason": "stop"}]}, b"[DONE]"))

    transport = FakeTransport(answer(), answer())
    eng = engine_for(transport)
    prompt_req = GenerationRequest("r", SamplingParams(), prompt="Once")
    first, *_ = [e async for e in eng.generate(prompt_req)]
    assert first == TextDelta("z", 1)
    cont = GenerationRequest(
        "r", SamplingParams(), messages=(Message("user", "q"), Message("assistant", "par")),
        continue_final_message=True,
    )  # fmt: skip
    _ = [e async for e in eng.generate(cont)]
    bodies = transport.sent
    assert transport.urls[0] == "http://upstream:9/v1/completions"
    assert bodies[0]["prompt"] == "Once"
    assert bodies[1]["continue_final_message"] is True
    assert bodies[1]["add_generation_prompt"] is False


@pytest.fixture(scope="module")
def edge_process(model_path: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    port = free_port()
    cfg = tmp_path_factory.mktemp("edge") / "edge.yaml"
    cfg.write_text(
        f"""
server: {{host: 127.0.0.1, port: {port}, log_level: warning}}
instance: {{id: edge-http, region: test, version: v3}}
engine: {{model_path: {model_path}, model_name: smol, n_ctx: 512, n_threads: 2, warmup_tokens: 1}}
"""
    )
    url = f"http://127.0.0.1:{port}"
    with service_process(["edge_agent", "serve", "--config", str(cfg)], url):
        yield url


@pytest.mark.model
async def test_end_to_end_against_a_real_edge_agent_process(edge_process: str) -> None:
    eng = OpenAIHTTPEngine(
        OpenAIHTTPSettings(base_url=edge_process, model="smol", probe_interval_s=0.1, capacity=2)
    )
    await eng.start()
    try:
        assert await eng.ready()
        req = GenerationRequest("e2e", SamplingParams(max_tokens=5, temperature=0.0),
                                messages=(Message("user", "Say hello."),))  # fmt: skip
        events = [e async for e in eng.generate(req)]
        finish = events[-1]
        assert isinstance(finish, Finish)
        assert finish.completion_tokens == sum(e.tokens for e in events if isinstance(e, TextDelta))
        assert finish.prompt_tokens > 5
        # The load probe scraped the agent's /load report.
        import asyncio

        for _ in range(50):
            if eng.load().requests_ok >= 1:
                break
            await asyncio.sleep(0.05)
        report = eng.load()
        assert report.requests_ok >= 1
        assert report.version == "v3"
        assert report.capacity == 1
        with pytest.raises(InvalidRequest):
            bad = GenerationRequest("bad", SamplingParams(max_tokens=5000), prompt="x")
            _ = [e async for e in eng.generate(bad)]
    finally:
        await eng.aclose()


async def test_unreachable_upstream_is_not_ready() -> None:
    eng = OpenAIHTTPEngine(
        OpenAIHTTPSettings(base_url=f"http://127.0.0.1:{free_port()}", model="m")
    )
    await eng.start()
    try:
        assert not await eng.ready()
        with pytest.raises(UpstreamUnavailable):
            _ = [e async for e in eng.generate(REQ)]
    finally:
        await eng.aclose()


async def test_one_connection_serves_request_after_request() -> None:
    """The body is read to its end after [DONE], so the pooled connection is reused;
    left unread, every request paid a new TCP connect (~3 ms here) on its TTFT."""
    from starlette.applications import Starlette
    from starlette.requests import Request
    from starlette.responses import StreamingResponse
    from starlette.routing import Route

    from hybrid_llm.local.servers import UvicornThread

    peers: list[int] = []

    async def completions(request: Request) -> StreamingResponse:
        assert request.client is not None
        peers.append(request.client.port)

        async def body() -> Any:
            yield sse(chunk("hi"), chunk(finish="stop"), b"[DONE]")

        return StreamingResponse(body(), media_type="text/event-stream")

    paths = ("/v1/completions", "/v1/chat/completions")
    app = Starlette(routes=[Route(p, completions, methods=["POST"]) for p in paths])
    with UvicornThread(app) as server:
        engine = OpenAIHTTPEngine(OpenAIHTTPSettings(base_url=server.url, model="m"), probe=None)
        try:
            for _ in range(3):
                events = await collect(engine)
                assert isinstance(events[-1], Finish)
        finally:
            await engine.aclose()
    assert len(peers) == 3
    assert len(set(peers)) == 1


async def test_a_connect_timeout_is_unavailable_as_in_the_router() -> None:
    """Nothing was sent: 503 ``upstream_unavailable`` (retryable), as the router maps it
    (tests/geo_router/test_failover.py), not a 504."""
    with unanswered_url() as hung:
        settings = OpenAIHTTPSettings(base_url=hung, model="m", connect_timeout_s=0.2)
        engine = OpenAIHTTPEngine(settings, probe=None)
        try:
            with pytest.raises(UpstreamUnavailable) as info:
                await collect(engine)
        finally:
            await engine.aclose()
    assert info.value.code == "upstream_unavailable"
    assert info.value.retryable


async def test_an_upstream_silent_before_its_head_times_out() -> None:
    """The lean pool leaves the wait for the head to its caller (a prefill comes
    first); the engine bounds it by ``read_timeout_s``, as httpx did."""
    import asyncio

    async def silent(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.read()  # until the engine gives up and closes
        writer.close()
        await writer.wait_closed()

    server = await asyncio.start_server(silent, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    settings = OpenAIHTTPSettings(base_url=f"http://127.0.0.1:{port}", model="m",
                                  read_timeout_s=0.2)  # fmt: skip
    engine = OpenAIHTTPEngine(settings, probe=None)
    try:
        with pytest.raises(UpstreamTimeout):
            await asyncio.wait_for(collect(engine), 3)
    finally:
        await engine.aclose()
        server.close()
        await server.wait_closed()


async def test_the_load_probe_outlives_a_load_it_cannot_read() -> None:
    """An upstream's /load that is not a JSON object (here a list) is one failed read:
    the probe asks again and takes the next report. Before the shared reader, the
    list's AttributeError ended the probe, and the engine never learned its load."""
    import asyncio

    from starlette.applications import Starlette
    from starlette.requests import Request
    from starlette.responses import JSONResponse, PlainTextResponse
    from starlette.routing import Route

    from hybrid_llm.local.servers import UvicornThread
    from servekit.engine.protocol import LoadReport

    answers: list[Any] = [[1, 2], LoadReport(ready=True, waiting=5).to_dict()]

    async def load(request: Request) -> JSONResponse:
        return JSONResponse(answers[0] if len(answers) == 1 else answers.pop(0))

    async def health(request: Request) -> PlainTextResponse:
        return PlainTextResponse("ok")

    app = Starlette(routes=[Route("/load", load), Route("/health", health)])
    with UvicornThread(app) as server:
        settings = OpenAIHTTPSettings(base_url=server.url, model="m", probe_interval_s=0.05)
        engine = OpenAIHTTPEngine(settings)
        await engine.start()
        try:
            for _ in range(100):
                if engine.load().waiting == 5:
                    break
                await asyncio.sleep(0.02)
            assert engine.load().waiting == 5
            assert await engine.ready()
        finally:
            await engine.aclose()
