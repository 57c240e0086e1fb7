"""The replica pool's dispatch in process: scripted engines, replica health set by hand."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from central.pool import ReplicaPool
from central.replica import ReplicaState
from central.settings import CentralSettings
from hybrid_llm.local.scripted_engine import ScriptedEngine
from servekit.engine.protocol import GenerationRequest, Message, SamplingParams, TextDelta
from servekit.errors import NotReady


def _pool(tmp_path: Path, wait_s: float) -> tuple[ReplicaPool, ScriptedEngine]:
    settings = CentralSettings.model_validate(
        {
            "model": "big",
            "replicas": [{"name": "r0", "kind": "url", "url": "http://127.0.0.1:9"}],
            "supervision": {"log_dir": str(tmp_path), "dispatch_wait_s": wait_s},
        }
    )
    engine = ScriptedEngine("big")
    return ReplicaPool(settings, lambda _endpoint: engine), engine


REQUEST = GenerationRequest("r", SamplingParams(max_tokens=4), messages=(Message("user", "hi"),))


def test_a_request_waits_for_a_replica_to_come_back(tmp_path: Path) -> None:
    async def run() -> None:
        pool, engine = _pool(tmp_path, wait_s=30.0)
        await engine.start()
        stream = pool.generate(REQUEST)
        first = asyncio.create_task(anext(stream))
        await asyncio.sleep(0.05)  # it reaches the pool and finds no healthy replica
        assert not first.done()  # waiting, not refused
        pool.replicas[0]._set(ReplicaState.HEALTHY)  # as the supervisor's probe would
        assert isinstance(await first, TextDelta)
        assert pool.replicas[0].inflight == 1
        await stream.aclose()
        assert pool.replicas[0].inflight == 0
        await pool.aclose()

    asyncio.run(run())


def test_with_no_replica_back_in_time_the_request_is_not_ready(tmp_path: Path) -> None:
    async def run() -> None:
        pool, _engine = _pool(tmp_path, wait_s=0.01)
        with pytest.raises(NotReady) as caught:
            await anext(pool.generate(REQUEST))
        assert caught.value.retry_after == 2
        await pool.aclose()

    asyncio.run(run())
