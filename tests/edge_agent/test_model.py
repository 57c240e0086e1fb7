"""The real engines behind the agent (the bundled GGUF model): what only a
model can show. The HTTP layer over a scripted engine is in ``test_asgi.py``
and ``test_socket.py``."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import openai
import pytest

from edge_agent.app import create_app
from tests.edge_agent.conftest import (
    MODEL,
    in_process,
    sdk_chat_whole_and_streamed,
    settings_from,
)
from tests.support.servers import UvicornThread, wait_ready

pytestmark = pytest.mark.model


@pytest.fixture(scope="module")
def agent(model_path: Any) -> Iterator[UvicornThread]:
    settings = settings_from(
        model_path, instance__id="edge-model", engine__n_ctx=512, engine__warmup_tokens=1
    )
    with UvicornThread(create_app(settings)) as server:
        wait_ready(server.url, timeout=120)
        yield server


def test_the_model_streams_what_it_answers_whole_with_usage(agent: UvicornThread) -> None:
    assert sdk_chat_whole_and_streamed(agent.url)  # greedy: the same answer both ways
    client = openai.OpenAI(base_url=agent.url + "/v1", api_key="unused", max_retries=0, timeout=60)
    completion = client.completions.create(
        model="edge", prompt="The sky is", max_tokens=4, temperature=0
    )
    assert completion.choices[0].text
    assert completion.usage is not None
    assert 0 < completion.usage.completion_tokens <= 4


def test_a_prompt_longer_than_the_context_is_a_400(agent: UvicornThread) -> None:
    client = openai.OpenAI(base_url=agent.url + "/v1", api_key="unused", max_retries=0, timeout=60)
    with pytest.raises(openai.BadRequestError) as caught:
        client.chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": "word " * 600}], max_tokens=2
        )
    assert caught.value.param == "messages"


@pytest.mark.anyio
async def test_batching_engine_behind_the_agent(model_path: Path) -> None:
    settings = settings_from(
        model_path,
        engine={
            "kind": "llama-batching",
            "model_path": str(model_path),
            "model_name": MODEL,
            "slots": 2,
            "ctx_per_slot": 256,
            "chunk_tokens": 32,
            "warmup_tokens": 1,
        },
    )
    body = {"model": MODEL, "messages": [{"role": "user", "content": "Hi"}], "temperature": 0}
    async with in_process(create_app(settings), within_s=120) as c:
        results = await asyncio.gather(
            *(c.post("/v1/chat/completions", json={**body, "max_tokens": 4}) for _ in range(3))
        )
        assert [r.status_code for r in results] == [200, 200, 200]
        assert (await c.get("/load")).json()["capacity"] == 2
        r = await c.post("/v1/chat/completions", json={**body, "max_tokens": 300})
        assert r.status_code == 400
        assert r.json()["error"]["param"] == "max_tokens"
        metrics = (await c.get("/metrics")).text
        assert "servekit:batch_size_sequences" in metrics
