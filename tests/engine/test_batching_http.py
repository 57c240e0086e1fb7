"""The batching engine behind the shared OpenAI serving layer, on a real socket:
concurrent SSE streams, one client hanging up mid-stream."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest
from fastapi import FastAPI
from prometheus_client import CollectorRegistry

from hybrid_llm.local.servers import UvicornThread, wait_ready
from servekit.admission import AdmissionQueue
from servekit.api import FixedEngine, ServingCore, build_serving_app
from servekit.engine.batching import BatchingLlamaEngine, BatchingSettings
from servekit.metrics import ServingMetrics

pytestmark = [pytest.mark.model, pytest.mark.anyio]

MODEL = "smollm2"
SLOTS = 3


@pytest.fixture(scope="module")
def served(model_path: Path) -> Iterator[tuple[str, BatchingLlamaEngine]]:
    engine = BatchingLlamaEngine(
        BatchingSettings(
            model_path=model_path,
            model_name=MODEL,
            slots=SLOTS,
            ctx_per_slot=512,
            chunk_tokens=32,
            n_threads=2,
            warmup_tokens=1,
        )
    )

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        await engine.start()
        metrics = ServingMetrics(
            CollectorRegistry(),
            model=MODEL,
            version="v1",
            region="test",
            tier="edge",
            load=engine.load,
        )
        app.state.core = ServingCore(
            FixedEngine(engine), AdmissionQueue(engine.capacity, 4), metrics
        )
        yield
        await engine.aclose()

    app = build_serving_app(title="batching", version="test", lifespan=lifespan)
    with UvicornThread(app) as server:
        wait_ready(server.url)
        yield server.url, engine


def chat(content: str, max_tokens: int) -> dict[str, Any]:
    return {
        "model": MODEL,
        "messages": [{"role": "user", "content": content}],
        "temperature": 0,
        "max_tokens": max_tokens,
        "stream": True,
    }


# Greedy decoding keeps counting until max_tokens: a request that runs as long as we like.
COUNTING = {
    "model": MODEL,
    "prompt": "1, 2, 3, 4, 5, 6, 7, 8,",
    "temperature": 0,
    "max_tokens": 400,
    "stream": True,
}


async def stream(client: httpx.AsyncClient, url: str, payload: dict[str, Any], keep: int) -> int:
    """Read up to ``keep`` text chunks (all of them if 0); return how many were read."""
    chunks = 0
    path = "/v1/chat/completions" if "messages" in payload else "/v1/completions"
    async with client.stream("POST", url + path, json=payload) as resp:
        assert resp.status_code == 200
        async for line in resp.aiter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            choices = json.loads(line[6:])["choices"]
            if choices and (choices[0].get("delta", {}).get("content") or choices[0].get("text")):
                chunks += 1
                if keep and chunks >= keep:
                    return chunks  # leaving the block closes the connection
    return chunks


async def test_concurrent_sse_streams_and_a_disconnect(
    served: tuple[str, BatchingLlamaEngine],
) -> None:
    url, engine = served
    cancelled = engine.stats().requests_cancelled
    async with httpx.AsyncClient(timeout=60) as client:
        full = [
            asyncio.create_task(stream(client, url, chat(f"Tell me about {t}.", 12), keep=0))
            for t in ("cats", "the moon")
        ]
        gone = await stream(client, url, COUNTING, keep=2)
        assert gone == 2
        counts = await asyncio.gather(*full)
        assert all(c > 0 for c in counts)
        # The hung-up request is cancelled in the engine long before its 400 tokens,
        # once the server notices the closed connection (bounded wait).
        async with asyncio.timeout(30):
            # Polling a counter the worker thread writes; there is no event to await.
            while engine.stats().requests_cancelled == cancelled:  # noqa: ASYNC110
                await asyncio.sleep(0.05)
        load = (await client.get(url + "/load")).json()
    assert load["capacity"] == SLOTS
    assert load["running"] == 0
    assert "busy_ms_per_seq" in load  # measured by the scheduler, carried by /load
    assert engine.stats().decode_tokens < 200
