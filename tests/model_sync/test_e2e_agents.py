"""Two real edge agents (llama.cpp, HTTP on real sockets, registered in the
embedded registry), each with a Reconciler wired to its hot swap, driven by the
controller under continuous client load: v2 rolls out canary → region b, then
a v3 that uploads fine but cannot load is rolled back automatically. No client
request fails at any point. The versions are signed and the edges trust only
the operator's key, as in production."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import anyio
import httpx
import pytest
import uvicorn

from edge_agent.app import create_app
from edge_agent.settings import EdgeSettings
from hybrid_llm.local.servers import free_port
from model_sync import ops
from model_sync.agent import Reconciler, ReconcilerSettings
from model_sync.controller import Controller
from model_sync.plan import build_plan
from model_sync.records import GateSettings
from model_sync.signing import SigningKey, generate_keypair
from model_sync.store import SyncStore
from servekit.registry import Registry
from tests.model_sync.fleet import wait_state

pytestmark = [pytest.mark.anyio, pytest.mark.model, pytest.mark.slow]


@contextlib.asynccontextmanager
async def edge(
    tg: Any, model_path: Path, db: Path, node: str, region: str, root: Path, trusted: Path
) -> AsyncIterator[tuple[str, Reconciler]]:
    """An edge agent served by uvicorn in this event loop (stopped gracefully on
    exit, so its lifespan closes the engines), plus a Reconciler wired to it."""
    port = free_port()
    settings = EdgeSettings.model_validate(
        {
            "server": {"port": port, "log_level": "warning"},
            "instance": {"id": node, "region": region, "version": "v1"},
            "engine": {
                "model_path": str(model_path),
                "model_name": "smollm2",
                "n_ctx": 256,
                "n_threads": 1,
                "warmup_tokens": 1,
            },
            "registry": {
                "backend": "embedded",
                "embedded": {"path": str(db)},
                "ttl_s": 5,
                "heartbeat_interval_s": 0.3,
            },
        }
    )
    app = create_app(settings)
    server = uvicorn.Server(
        uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning", lifespan="on")
    )
    tg.start_soon(server.serve)
    url = f"http://127.0.0.1:{port}"
    async with httpx.AsyncClient() as client:
        with anyio.fail_after(120):
            while True:
                with contextlib.suppress(httpx.HTTPError):
                    if (await client.get(f"{url}/ready")).status_code == 200:
                        break
                await anyio.sleep(0.1)
    agent = app.state.agent
    reconciler = Reconciler.from_settings(
        ReconcilerSettings(
            model_dir=root / node,
            local_roots=[Path("models"), root.parent],  # the test's own artifacts too
            watch_timeout_s=0.3,
            report_interval_s=0.3,
            trusted_keys_file=str(trusted),
        ),
        agent.registration.registry,
        node,
        agent.swap_model,
        model="smollm2",
        version="v1",
        stats=agent.core.load,
    )
    try:
        yield url, reconciler
    finally:
        server.should_exit = True


async def test_rollout_and_rollback_under_load(
    model_path: Path, tmp_path: Path, registry: Registry
) -> None:
    db = tmp_path / "registry.db"  # the fixture's file: everyone shares it
    store = SyncStore(registry, actor="ops")
    private, trusted = generate_keypair(tmp_path / "keys")
    key = SigningKey.from_pem(private.read_text())
    await ops.push(store, str(model_path), model="smollm2", version="v1", signer=key)
    await ops.push(
        store, str(model_path), model="smollm2", version="v2", filename="v2.gguf", signer=key
    )
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(b"GGUF" + b"\0" * 4096)
    await ops.push(store, str(bad), model="smollm2", version="v3", signer=key)
    outcomes: list[int] = []
    root = tmp_path / "models"
    gates = GateSettings(min_requests=3, max_ttft_p95_ratio=10, ttft_slack_ms=2000)

    async with (
        anyio.create_task_group() as servers,
        edge(servers, model_path, db, "edge-a", "a", root, trusted) as (url_a, rec_a),
        edge(servers, model_path, db, "edge-b", "b", root, trusted) as (url_b, rec_b),
        httpx.AsyncClient(timeout=60) as client,
        anyio.create_task_group() as workers,
    ):

        async def load(url: str) -> None:
            body = {
                "model": "smollm2",
                "messages": [{"role": "user", "content": "Say hi"}],
                "max_tokens": 2,
            }
            while True:
                r = await client.post(f"{url}/v1/chat/completions", json=body)
                outcomes.append(r.status_code)

        for task in (rec_a.run, rec_b.run, Controller(registry, tick_s=0.2, lock_ttl_s=5).run):
            workers.start_soon(task)
        workers.start_soon(load, url_a)
        workers.start_soon(load, url_b)

        for version, expected in (("v2", "completed"), ("v3", "rolled_back")):
            plan = await build_plan(
                registry,
                store,
                "smollm2",
                version,
                canary="1",
                waves="by-region",
                bake_s=1.5,
                gates=gates,
                converge_timeout_s=120,
            )
            await ops.start_rollout(store, plan)
            final = await wait_state(store, "smollm2", lambda s: not s.active, within=240)
            assert final.status == expected, final.reason
        nodes = await store.nodes()
        workers.cancel_scope.cancel()

    assert "EngineFailure" in final.reason
    assert {n: a.version for n, (_, a) in nodes.items() if a} == {"edge-a": "v2", "edge-b": "v2"}
    assert len(outcomes) > 10
    assert set(outcomes) == {200}, f"{len([o for o in outcomes if o != 200])} failed requests"
