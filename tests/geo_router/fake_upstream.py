"""A real HTTP double of an OpenAI-compatible upstream, misbehaving on demand.

It streams the words ``w0 w1 ... w{N-1}``; a continuation request (chat with a
final assistant message and ``continue_final_message``, or a prompt ending in
words) resumes after the words already present, so a spliced stream reads
exactly ``w0 .. w{N-1}`` once. Run in a thread (``UvicornThread``) or as a
process (``python -m tests.geo_router.fake_upstream``) that tests SIGKILL.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time
from dataclasses import dataclass, field
from typing import Any

import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route


@dataclass
class Behavior:
    model: str = "fake-model"
    version: str = "v1"
    words: int = 8
    token_delay_s: float = 0.0
    first_token_delay_s: float = 0.0
    prefill_s_per_char: float = 0.0  # the first token waits this much more per chat character
    status: int = 200  # non-200: answer every generation with this status
    retry_after: str | None = None
    refuse_after_s: float = 0.0  # a non-200 answer comes this late (refused after queueing)
    die_after: int | None = None  # words sent before the connection is cut
    stall_after: int | None = None  # words sent before it goes quiet (connection open)
    max_prompt_chars: int | None = None  # longer prompts: 400 context_length_exceeded
    ready: bool = True
    # Usage in every chunk, as vLLM sends with ``continuous_usage_stats``, at this many
    # tokens a word (so chunks and tokens differ); 0: usage only at the end, if asked.
    usage_tokens_per_word: int = 0
    prompt_tokens: int = 3  # what its usage reports for any prompt
    load: dict[str, Any] = field(default_factory=dict)
    seen: list[dict[str, Any]] = field(default_factory=list)  # bodies + headers received
    aborted: int = 0  # streams whose reader went away before the end


def _already(body: dict[str, Any]) -> int:
    if body.get("continue_final_message"):
        text = body["messages"][-1]["content"]
    elif "prompt" in body:
        text = body["prompt"]
        return sum(1 for w in text.split() if w.startswith("w") and w[1:].isdigit())
    else:
        return 0
    return len(text.split())


def build_app(b: Behavior) -> Starlette:
    async def generate(request: Request) -> Response:
        body = await request.json()
        port = request.client.port if request.client else None  # one per connection
        seen = {"body": body, "headers": dict(request.headers), "at": time.monotonic()}
        b.seen.append({**seen, "client_port": port})
        if b.status != 200:
            await asyncio.sleep(b.refuse_after_s)
            headers = {"Retry-After": b.retry_after} if b.retry_after else {}
            err = {"error": {"message": f"fake {b.status}", "type": "x", "code": None}}
            return JSONResponse(err, status_code=b.status, headers=headers)
        chat = request.url.path.endswith("/chat/completions")
        size = sum(len(str(m.get("content", ""))) for m in body.get("messages", []))
        if b.max_prompt_chars is not None and size > b.max_prompt_chars:
            err = {"error": {"message": "too long", "type": "invalid_request_error",
                             "param": "messages", "code": "context_length_exceeded"}}  # fmt: skip
            return JSONResponse(err, status_code=400)
        start = _already(body)
        limit = body.get("max_completion_tokens") or body.get("max_tokens") or 10**6
        end = min(b.words, start + limit)
        reason = "stop" if end == b.words else "length"
        cid = "cmpl-fake-" + str(len(b.seen))

        def frame(text: str | None, finish: str | None = None, role: bool = False) -> bytes:
            choice: dict[str, Any] = {"index": 0, "finish_reason": finish, "logprobs": None}
            if chat:
                delta: dict[str, Any] = {"role": "assistant"} if role else {}
                if text is not None:
                    delta["content"] = text
                choice["delta"] = delta
            else:
                choice["text"] = text or ""
            obj = "chat.completion.chunk" if chat else "text_completion"
            event = {"id": cid, "object": obj, "created": 1, "model": b.model, "choices": [choice]}
            return b"data: " + json.dumps(event).encode() + b"\n\n"

        async def events() -> Any:
            try:
                async for item in body_events():
                    yield item
            except BaseException:
                b.aborted += 1
                raise

        async def body_events() -> Any:
            if chat:
                yield frame(None, role=True)
            await asyncio.sleep(b.first_token_delay_s + b.prefill_s_per_char * size)
            for i in range(start, end):
                if b.die_after is not None and i - start >= b.die_after:
                    raise ConnectionResetError("fake upstream dies mid-stream")
                if b.stall_after is not None and i - start >= b.stall_after:
                    await asyncio.sleep(3600)
                chunk = frame(f" w{i}" if i else "w0")
                if b.usage_tokens_per_word:
                    event = json.loads(chunk[6:])
                    done = (i + 1 - start) * b.usage_tokens_per_word
                    event["usage"] = {"prompt_tokens": b.prompt_tokens, "completion_tokens": done}
                    chunk = b"data: " + json.dumps(event).encode() + b"\n\n"
                yield chunk
                if b.token_delay_s:
                    await asyncio.sleep(b.token_delay_s)
            yield frame(None, finish=reason)
            opts = body.get("stream_options") or {}
            if opts.get("include_usage"):
                usage = {
                    "prompt_tokens": b.prompt_tokens,
                    "completion_tokens": end - start,
                    "total_tokens": b.prompt_tokens + end - start,
                }
                event = {"id": cid, "object": "x", "created": 1, "model": b.model}
                event.update(choices=[], usage=usage)
                yield b"data: " + json.dumps(event).encode() + b"\n\n"
            yield b"data: [DONE]\n\n"

        if not body.get("stream"):
            return JSONResponse({"error": {"message": "fake only streams", "type": "x"}}, 400)
        return StreamingResponse(events(), media_type="text/event-stream")

    async def ready(request: Request) -> Response:
        return JSONResponse({"ready": b.ready}, status_code=200 if b.ready else 503)

    async def load(request: Request) -> Response:
        report = {"ready": b.ready, "capacity": 4, "model": b.model, "version": b.version}
        report.update(b.load)
        return JSONResponse(report)

    return Starlette(
        routes=[
            Route("/v1/chat/completions", generate, methods=["POST"]),
            Route("/v1/completions", generate, methods=["POST"]),
            Route("/ready", ready),
            Route("/load", load),
        ]
    )


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--words", type=int, default=8)
    parser.add_argument("--token-delay", type=float, default=0.0)
    parser.add_argument("--model", default="fake-model")
    args = parser.parse_args()
    b = Behavior(model=args.model, words=args.words, token_delay_s=args.token_delay)
    uvicorn.run(build_app(b), host="127.0.0.1", port=args.port, log_level="warning")


if __name__ == "__main__":
    main()
