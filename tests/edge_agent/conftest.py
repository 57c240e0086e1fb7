from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
from asgi_lifespan import LifespanManager
from fastapi import FastAPI

from edge_agent.app import create_app
from edge_agent.settings import EdgeEngineSettings, EdgeSettings
from hybrid_llm.local.scripted_engine import ScriptedEngine

MODEL = "smollm2-135m-instruct"


def settings_from(model_file: Path, **overrides: Any) -> EdgeSettings:
    """EdgeSettings over ``model_file`` with dotted (``a__b``) overrides."""
    data: dict[str, Any] = {
        "instance": {"id": "edge-test", "region": "test", "version": "v1"},
        "engine": {
            "model_path": str(model_file),
            "model_name": MODEL,
            "n_ctx": 1024,
            "n_threads": 2,
            "warmup_tokens": 2,
        },
        "admission": {"max_waiting": 4},
        "server": {"log_level": "warning"},
    }
    for key, value in overrides.items():
        node = data
        parts = key.split("__")
        for part in parts[:-1]:
            node = node.setdefault(part, {})
        node[parts[-1]] = value
    return EdgeSettings.model_validate(data)


@pytest.fixture
def edge_settings(model_path: Path) -> Callable[..., EdgeSettings]:
    """Build EdgeSettings for the real model with dotted overrides."""
    return lambda **overrides: settings_from(model_path, **overrides)


class ScriptedEngines:
    """The agent's engine seam, building scripted engines (one per version) it keeps.

    Each engine has the settings' model name, context window and version;
    with ``hold_start`` every engine's start waits for that event; ``pace_s``
    apart its counted tokens.
    """

    def __init__(
        self,
        *,
        capacity: int = 1,
        hold_start: asyncio.Event | None = None,
        pace_s: float = 0.01,
    ) -> None:
        self.capacity = capacity
        self.hold_start = hold_start
        self.pace_s = pace_s
        self.built: list[ScriptedEngine] = []

    def __call__(self, settings: EdgeEngineSettings, version: str) -> ScriptedEngine:
        engine = ScriptedEngine(
            settings.model_name,
            capacity=self.capacity,
            version=version,
            context_window=settings.context_window,
            hold_start=self.hold_start,
            pace_s=self.pace_s,
        )
        self.built.append(engine)
        return engine

    @property
    def current(self) -> ScriptedEngine:
        return self.built[-1]


@pytest.fixture
def stand_in_model(tmp_path: Path) -> Path:
    """A file where the settings expect a model; the scripted engine never reads it."""
    path = tmp_path / "stand-in.gguf"
    path.write_bytes(b"GGUF scripted")
    return path


@pytest.fixture
def scripted_settings(stand_in_model: Path) -> Callable[..., EdgeSettings]:
    """EdgeSettings for an agent over scripted engines, with dotted overrides."""
    return lambda **overrides: settings_from(stand_in_model, **overrides)


async def wait_ready(client: httpx.AsyncClient, within_s: float = 30.0) -> None:
    for _ in range(int(within_s / 0.01)):
        if (await client.get("/ready")).status_code == 200:
            return
        await asyncio.sleep(0.01)
    raise TimeoutError("the agent never became ready")


@asynccontextmanager
async def in_process(
    app: FastAPI, *, ready: bool = True, within_s: float = 30.0
) -> AsyncIterator[httpx.AsyncClient]:
    """The app with its lifespan running, through the ASGI transport; with ``ready``,
    once ``/ready`` says 200 (``within_s`` also bounds each request)."""
    async with LifespanManager(app) as manager:
        transport = httpx.ASGITransport(app=manager.app)
        async with httpx.AsyncClient(
            transport=transport, base_url="http://edge", timeout=within_s
        ) as client:
            if ready:
                await wait_ready(client, within_s)
            yield client


def sdk_chat_whole_and_streamed(url: str) -> str:
    """Ask one question twice through the openai SDK, whole and streamed with usage;
    assert the stream carries the same answer, finish reason and usage; the answer."""
    client = openai.OpenAI(base_url=url + "/v1", api_key="unused", max_retries=0, timeout=60)
    messages: Any = [{"role": "user", "content": "What is the capital of France?"}]
    ask: dict[str, Any] = {"model": MODEL, "messages": messages, "max_tokens": 16,
                           "temperature": 0}  # fmt: skip
    whole = client.chat.completions.create(**ask)
    chunks = list(
        client.chat.completions.create(**ask, stream=True, stream_options={"include_usage": True})
    )
    streamed = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert streamed == whole.choices[0].message.content
    assert chunks[0].choices[0].delta.role == "assistant"
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == (
        whole.choices[0].finish_reason
    )
    final = chunks[-1]
    assert final.choices == []
    assert final.usage is not None
    assert whole.usage is not None
    assert final.usage.completion_tokens == whole.usage.completion_tokens
    assert final.usage.prompt_tokens == whole.usage.prompt_tokens
    assert final.usage.total_tokens == final.usage.prompt_tokens + final.usage.completion_tokens
    return streamed


def scripted_app(settings: EdgeSettings, engines: ScriptedEngines | None = None) -> FastAPI:
    return create_app(settings, engine_factory=engines or ScriptedEngines())
