"""The OpenAI-HTTP engine: error translation and stream parsing at the transport
layer, then end to end against a real edge agent process."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable, Iterator
from typing import Any

import httpx
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


def engine_for(
    handler: Callable[[httpx.Request], httpx.Response], **settings: Any
) -> OpenAIHTTPEngine:
    client = httpx.AsyncClient(transport=httpx.MockTransport(handler))
    return OpenAIHTTPEngine(
        OpenAIHTTPSettings(
            base_url="http://upstream:9/v1", model="up-model", served_name="mine", **settings
        ),
        client=client,
        probe=None,
    )


async def collect(engine: OpenAIHTTPEngine) -> list[GenerationEvent]:
    return [e async for e in engine.generate(REQ)]


async def test_request_shape_and_stream_parsing() -> None:
    seen: dict[str, Any] = {}

    def handler(request: httpx.Request) -> httpx.Response:
        seen["url"] = str(request.url)
        seen["headers"] = dict(request.headers)
        seen["body"] = json.loads(request.content)
        body = sse(
            {"choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}}]},
            chunk("Hel"), chunk("lo"), chunk(None, "length"),
            {"choices": [], "usage": {"prompt_tokens": 7, "completion_tokens": 2,
                                      "prompt_tokens_details": {"cached_tokens": 3}}},
            b"[DONE]",
        )  # fmt: skip
        return httpx.Response(200, content=body, headers={"content-type": "text/event-stream"})

    events = await collect(engine_for(handler))
    assert seen["url"] == "http://upstream:9/v1/chat/completions"
    assert seen["headers"]["x-request-id"] == "rid-1"
    assert seen["headers"]["x-priority"] == "batch"
    body = seen["body"]
    assert body["model"] == "up-model"
    assert body["stream"] is True
    assert body["stream_options"] == {"include_usage": True}
    assert body["max_tokens"] == 4
    assert body["stop"] == ["x"]
    assert body["top_k"] == 3
    assert body["messages"] == [{"role": "user", "content": "hi"}]
    assert events == [TextDelta("Hel", 1), TextDelta("lo", 1), Finish("length", 7, 2, 3)]


async def test_request_fields_are_the_services_setting() -> None:
    bodies: list[dict[str, Any]] = []

    def handler(request: httpx.Request) -> httpx.Response:
        bodies.append(json.loads(request.content))
        content = sse(chunk("a", "stop"), b"[DONE]")
        return httpx.Response(200, content=content, headers={"content-type": "text/event-stream"})

    fields = {"ignore_eos": True, "max_tokens": 999}
    [e async for e in engine_for(handler, request_fields=fields).generate(REQ)]
    assert bodies[0]["ignore_eos"] is True
    assert bodies[0]["max_tokens"] == 4  # the request's own fields win


async def test_the_callers_cache_salt_is_sent_unless_the_upstream_refuses_it() -> None:
    bodies: list[dict[str, Any]] = []

    def handler(request: httpx.Request) -> httpx.Response:
        bodies.append(json.loads(request.content))
        content = sse(chunk("a", "stop"), b"[DONE]")
        return httpx.Response(200, content=content, headers={"content-type": "text/event-stream"})

    salted = dataclasses.replace(REQ, cache_salt="s" * 64)
    [e async for e in engine_for(handler).generate(salted)]
    [e async for e in engine_for(handler).generate(REQ)]
    [e async for e in engine_for(handler, send_cache_salt=False).generate(salted)]
    assert [b.get("cache_salt") for b in bodies] == ["s" * 64, None, None]


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
    def handler(request: httpx.Request) -> httpx.Response:
        content = payload if isinstance(payload, bytes) else json.dumps(payload).encode()
        return httpx.Response(status, content=content, headers=headers)

    with pytest.raises(cls) as info:
        await collect(engine_for(handler))
    if status == 429:
        assert info.value.retry_after == 3
    if status == 400:
        assert info.value.param == "max_tokens"


@pytest.mark.parametrize(
    ("exc", "cls"),
    [
        (httpx.ConnectError("refused"), UpstreamUnavailable),
        (httpx.ReadTimeout("slow"), UpstreamTimeout),
        (httpx.RemoteProtocolError("reset"), UpstreamError),
    ],
)
async def test_transport_failures_are_translated(exc: Exception, cls: type[ServeError]) -> None:
    def handler(request: httpx.Request) -> httpx.Response:
        raise exc

    with pytest.raises(cls):
        await collect(engine_for(handler))


async def test_stream_cut_mid_way_is_an_upstream_error() -> None:
    def handler(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, content=sse(chunk("partial")))

    events: list[GenerationEvent] = []
    with pytest.raises(UpstreamError) as info:
        async for e in engine_for(handler).generate(REQ):
            events.append(e)
    assert events == [TextDelta("partial", 1)]
    assert info.value.code == "upstream_disconnected"


async def test_error_event_inside_stream() -> None:
    def handler(request: httpx.Request) -> httpx.Response:
        return httpx.Response(
            200,
            content=sse(chunk("a"), {"error": {"message": "engine died", "type": "x"}}, b"[DONE]"),
        )

    with pytest.raises(UpstreamError, match="engine died"):
        await collect(engine_for(handler))


async def test_completion_path_and_continue_flags() -> None:
    bodies: list[dict[str, Any]] = []

    def handler(request: httpx.Request) -> httpx.Response:
        bodies.append(json.loads(request.content))
        return httpx.Response(
            200, content=sse({"choices": [{"text": "z", "finish_reason": "stop"}]}, b"[DONE]")
        )

    eng = engine_for(handler)
    prompt_req = GenerationRequest("r", SamplingParams(), prompt="Once")
    first, *_ = [e async for e in eng.generate(prompt_req)]
    assert first == TextDelta("z", 1)
    cont = GenerationRequest(
        "r", SamplingParams(), messages=(Message("user", "q"), Message("assistant", "par")),
        continue_final_message=True,
    )  # fmt: skip
    _ = [e async for e in eng.generate(cont)]
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
