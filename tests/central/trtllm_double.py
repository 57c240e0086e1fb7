"""A real HTTP double of `trtllm-serve`, written from TensorRT-LLM's
``tensorrt_llm/serve/openai_server.py``, for what differs from vLLM:

- ``GET /metrics`` gathers iteration stats with ``get_stats_async(2)``: with
  nothing new it answers an empty JSON list after a 2-second wait;
- every exception in a completion handler becomes ``create_error_response(str(e))``:
  HTTP 400 with the flat ``ErrorResponse`` body ``{"object": "error", "message",
  "type": "BadRequestError", "param": null, "code": 400}``;
- request validation errors are ``{"error": "<text>"}`` with 400;
- the body's ``priority`` (TensorRT-LLM: a float in 0..1, higher first) is recorded.

``POST /fail?n=N`` makes the next N completions raise (an engine failure);
prompts starting with ``REJECT`` are refused every time (the request's fault).
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator
from typing import Any

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

# get_stats_async(2) ends after 2 s without a new stat: never sooner, a little later
# (the last iteration's stats are gathered and serialized first).
STATS_WAIT_S = 2.2


def _flat_error(message: str) -> JSONResponse:
    body = {"object": "error", "message": message, "type": "BadRequestError",
            "param": None, "code": 400}  # fmt: skip
    return JSONResponse(body, status_code=400)


def create_trtllm_double(model_path: str) -> Starlette:
    state: dict[str, Any] = {"fail": 0, "priorities": [], "served": 0}

    async def health(request: Request) -> Response:
        return Response(status_code=200)

    async def metrics(request: Request) -> Response:
        await asyncio.sleep(STATS_WAIT_S)  # get_stats_async(2) with nothing new
        return JSONResponse([])

    async def fail(request: Request) -> Response:
        state["fail"] = int(request.query_params.get("n", "1"))
        return JSONResponse({"fail": state["fail"]})

    async def priorities(request: Request) -> Response:
        return JSONResponse(state["priorities"])

    async def counts(request: Request) -> Response:
        return JSONResponse({"fail": state["fail"], "served": state["served"]})

    async def completion(request: Request) -> Response:
        body = await request.json()
        chat = request.url.path.endswith("/chat/completions")
        if chat and not isinstance(body.get("messages"), list):
            return JSONResponse({"error": "1 validation error: messages: Field required"}, 400)
        state["priorities"].append(body.get("priority"))
        text = body["messages"][-1]["content"] if chat else str(body.get("prompt", ""))
        if state["fail"] > 0:
            state["fail"] -= 1
            return _flat_error("Executor worker returned error: out of KV cache blocks")
        if text.startswith("REJECT"):
            return _flat_error("The prompt is longer than max_seq_len (8192)")
        state["served"] += 1
        return StreamingResponse(_stream(model_path, chat), media_type="text/event-stream")

    return Starlette(
        routes=[
            Route("/health", health),
            Route("/metrics", metrics),
            Route("/fail", fail, methods=["POST"]),
            Route("/priorities", priorities),
            Route("/state", counts),
            Route("/v1/chat/completions", completion, methods=["POST"]),
            Route("/v1/completions", completion, methods=["POST"]),
        ]
    )


async def _stream(model: str, chat: bool) -> AsyncIterator[bytes]:
    created = int(time.time())
    for word in ("Hello", " from", " trt"):
        if chat:
            choice: dict[str, Any] = {"index": 0, "delta": {"content": word}, "finish_reason": None}
        else:
            choice = {"index": 0, "text": word, "finish_reason": None}
        chunk = {"id": "x", "object": "chunk", "created": created, "model": model,
                 "choices": [choice]}  # fmt: skip
        yield f"data: {json.dumps(chunk)}\n\n".encode()
    last: dict[str, Any] = {"index": 0, "finish_reason": "stop"}
    last.update({"delta": {}} if chat else {"text": ""})
    yield f"data: {json.dumps({'id': 'x', 'model': model, 'choices': [last]})}\n\n".encode()
    usage = {"prompt_tokens": 3, "completion_tokens": 3, "total_tokens": 6}
    tail = {"id": "x", "model": model, "choices": [], "usage": usage}
    yield f"data: {json.dumps(tail)}\n\n".encode()
    yield b"data: [DONE]\n\n"
