"""A real HTTP double of an OpenAI-compatible streaming server with known timing.

Each request sleeps ``ttft`` (plus ``prefill_s_per_token`` per prompt word,
and ``per_stream_s`` per stream already in flight: a prefill with decoders
riding along) before the first token and ``itl`` between the following ones,
streams ``max_tokens`` one-word tokens and answers with the router's ``X-Route-*``
headers (the tier echoed from the request's ``X-Want-Tier``, so tests can pin
routes). ``fail_every`` makes every n-th request a 429 in the OpenAI error shape.
``arrivals`` (when given) records each request's tier and how many were in
flight when it arrived; ``seen`` (when given) each request body.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from dataclasses import dataclass

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route


@dataclass
class Timing:
    ttft: float = 0.05
    itl: float = 0.01
    prefill_s_per_token: float = 0.0  # added to ttft per prompt word
    per_stream_s: float = 0.0  # added to ttft per stream in flight on arrival (mixed steps)
    fail_every: int = 0
    region: str = "region-a"
    predicted_ttft_ms: float | None = None  # sent as the router's X-Route-Predicted-Ttft-Ms
    prediction: str | None = None  # sent as the router's X-Route-Prediction


def create_app(
    timing: Timing,
    arrivals: list[tuple[str, int]] | None = None,
    seen: list[dict[str, object]] | None = None,
) -> Starlette:
    served = 0
    in_flight = 0

    async def complete(request: Request) -> Response:
        nonlocal served, in_flight
        served += 1
        if timing.fail_every and served % timing.fail_every == 0:
            return JSONResponse(
                {"error": {"message": "queue full", "type": "rate_limit", "code": None}},
                status_code=429,
                headers={"Retry-After": "1"},
            )
        body = json.loads(await request.body())
        if seen is not None:
            seen.append(body)
        n = int(body.get("max_tokens") or body.get("max_completion_tokens") or 16)
        chat = request.url.path.endswith("/chat/completions")
        tier = request.headers.get("x-want-tier", "edge")
        if arrivals is not None:
            arrivals.append((tier, in_flight))
        riders = in_flight
        in_flight += 1  # until its stream ends
        if chat:
            text = " ".join(str(m.get("content", "")) for m in body.get("messages", []))
        else:
            text = str(body.get("prompt", ""))
        words = len(text.split())

        def frame(text: str | None, usage: bool = False) -> bytes:
            event: dict[str, object] = {
                "id": "cmpl-fake",
                "object": "chat.completion.chunk" if chat else "text_completion",
                "created": 0,
                "model": str(body.get("model", "fake")),
            }
            if usage:
                event["choices"] = []
                event["usage"] = {
                    "prompt_tokens": words,
                    "completion_tokens": n,
                    "total_tokens": words + n,
                    # As if the first half of the prompt hit the prefix cache.
                    "prompt_tokens_details": {"cached_tokens": words // 2},
                }
            elif chat:
                event["choices"] = [{"index": 0, "delta": {"content": text}, "finish_reason": None}]
            else:
                event["choices"] = [{"index": 0, "text": text, "finish_reason": None}]
            return b"data: " + json.dumps(event).encode() + b"\n\n"

        async def stream() -> AsyncIterator[bytes]:
            nonlocal in_flight
            try:
                async for chunk in frames():
                    yield chunk
            finally:
                in_flight -= 1

        async def frames() -> AsyncIterator[bytes]:
            if chat:
                yield frame("")  # the role-only first event carries no text
            prefill = words * timing.prefill_s_per_token + riders * timing.per_stream_s
            await asyncio.sleep(timing.ttft + prefill)
            for i in range(n):
                if i:
                    await asyncio.sleep(timing.itl)
                yield frame(f" w{i}")
            yield frame(None, usage=True)
            yield b"data: [DONE]\n\n"

        headers = {
            "X-Route-Tier": tier,
            "X-Route-Region": timing.region,
            "X-Route-User-Region": "region-a",
            "X-Route-Reason": "simple" if tier == "edge" else "pinned",
        }
        if timing.predicted_ttft_ms is not None:  # as the router: its prediction, its timing
            headers["X-Route-Predicted-Ttft-Ms"] = f"{timing.predicted_ttft_ms:.0f}"
            headers["X-Route-Instance"] = f"{tier}-1"
            headers["Server-Timing"] = f"auth;dur=0.50, upstream;dur={timing.ttft * 1e3:.2f}"
        if timing.prediction is not None:
            headers["X-Route-Prediction"] = timing.prediction
        return StreamingResponse(stream(), media_type="text/event-stream", headers=headers)

    async def ready(_: Request) -> Response:
        return JSONResponse({"ready": True})

    async def load(_: Request) -> Response:
        return JSONResponse({"ready": True, "capacity": 4, "model": "fake"})

    return Starlette(
        routes=[
            Route("/v1/chat/completions", complete, methods=["POST"]),
            Route("/v1/completions", complete, methods=["POST"]),
            Route("/ready", ready),
            Route("/load", load),
            Route("/health", ready),
        ]
    )
