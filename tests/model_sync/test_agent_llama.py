"""The reconciler wired to a real edge agent's swap (llama.cpp engines): a
verified version is loaded beside the old one and takes over; a valid upload
that is not a model fails to load and the old version keeps serving."""

from __future__ import annotations

from pathlib import Path

import pytest

from edge_agent.app import EdgeAgent
from edge_agent.settings import EdgeSettings
from model_sync import ops
from model_sync.store import SyncStore
from servekit.engine.protocol import Finish, GenerationRequest, SamplingParams
from servekit.registry import Registry
from tests.model_sync.test_agent import running, wait_actual

pytestmark = [pytest.mark.anyio, pytest.mark.model]

PROMPT = GenerationRequest("t", SamplingParams(max_tokens=4, temperature=0.0), prompt="1, 2, 3,")


async def test_reconciler_hot_swaps_a_real_engine(
    model_path: Path, tmp_path: Path, registry: Registry
) -> None:
    from model_sync.agent import Reconciler

    settings = EdgeSettings.model_validate(
        {
            "instance": {"id": "edge-1", "region": "test", "version": "v1"},
            "engine": {
                "model_path": str(model_path),
                "model_name": "smollm2",
                "n_ctx": 256,
                "n_threads": 2,
                "warmup_tokens": 1,
            },
            "server": {"log_level": "warning"},
        }
    )
    agent = EdgeAgent(settings)
    await agent.start()
    store = SyncStore(registry, actor="ops")
    await ops.push(store, str(model_path), model="smollm2", version="v2")
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(b"GGUF" + b"\0" * 4096)  # uploads and verifies fine, never loads
    await ops.push(store, str(bad), model="smollm2", version="v3")
    reconciler = Reconciler(
        registry,
        "edge-1",
        tmp_path / "models",
        agent.swap_model,
        model="smollm2",
        version="v1",
        stats=agent.core.load,
        watch_timeout_s=0.2,
    )
    try:
        async with running(reconciler):
            await store.set_desired("edge-1", "smollm2", "v2")
            actual = await wait_actual(store, "edge-1", lambda a: a.version == "v2", 120)
            assert actual.state == "serving"
            assert agent.slot.version == "v2"
            installed = tmp_path / "models" / "smollm2" / "v2" / model_path.name
            assert agent.settings.engine.model_path == installed.resolve()
            events = [e async for e in agent.slot.current().generate(PROMPT)]
            assert isinstance(events[-1], Finish)

            await store.set_desired("edge-1", "smollm2", "v3")
            failed = await wait_actual(store, "edge-1", lambda a: a.state == "failed", 60)
            assert failed.version == "v2"
            assert failed.error is not None
            assert failed.error.startswith("EngineFailure")
            assert agent.slot.version == "v2"
            events = [e async for e in agent.slot.current().generate(PROMPT)]
            assert isinstance(events[-1], Finish)
    finally:
        await agent.aclose()
