"""The edge agent joins the embedded registry, beats its load, drains and leaves,
and follows the desired model version (over scripted engines: the registry
and model_sync are under test here, hot swap on the real model is in
``test_swap.py``)."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

import httpx

from hybrid_llm.local.servers import UvicornThread, free_port
from servekit.registry import RegistrySettings, open_registry
from tests.edge_agent.conftest import ScriptedEngines, scripted_app


def test_registers_heartbeats_and_deregisters(scripted_settings: Any, tmp_path: Path) -> None:
    reg = {"backend": "embedded", "ttl_s": 3, "heartbeat_interval_s": 0.3,
           "embedded": {"path": str(tmp_path / "registry.db")}}  # fmt: skip
    port = free_port()
    settings = scripted_settings(
        registry=reg, instance__id="edge-reg", instance__region="eu", server__port=port
    )

    async def instances() -> list[Any]:
        r = await open_registry(RegistrySettings.model_validate(reg))
        try:
            return await r.instances(tier="edge", healthy_only=False)
        finally:
            await r.aclose()

    app = scripted_app(settings)
    with UvicornThread(app, port=port) as server:
        deadline = time.monotonic() + 60
        found: list[Any] = []
        while time.monotonic() < deadline:
            found = asyncio.run(instances())
            if found and found[0].load.ready:
                break
            time.sleep(0.1)
        assert [s.info.id for s in found] == ["edge-reg"]
        state = found[0]
        assert state.info.region == "eu"
        assert state.info.port == server.port
        assert state.info.model == "smollm2-135m-instruct"
        assert state.load.capacity == 1
        httpx.post(server.url + "/v1/completions",
                   json={"model": "edge", "prompt": "Hi", "max_tokens": 2}, timeout=60)  # fmt: skip
        deadline = time.monotonic() + 10
        while asyncio.run(instances())[0].load.requests_ok < 1:
            assert time.monotonic() < deadline, "heartbeat never carried the new load"
            time.sleep(0.1)
        app.state.agent.drain()  # what SIGTERM triggers first
        deadline = time.monotonic() + 10
        while not asyncio.run(instances())[0].load.draining:
            assert time.monotonic() < deadline, "draining never reached the registry"
            time.sleep(0.1)
        assert httpx.get(server.url + "/ready").status_code == 503
    assert asyncio.run(instances()) == []


def test_model_sync_block_follows_desired_version(
    scripted_settings: Any, tmp_path: Path, stand_in_model: Path
) -> None:
    from model_sync import ops
    from model_sync.store import SyncStore

    reg = {"backend": "embedded", "ttl_s": 3, "heartbeat_interval_s": 0.3,
           "embedded": {"path": str(tmp_path / "registry.db")}}  # fmt: skip
    port = free_port()
    settings = scripted_settings(
        registry=reg, instance__id="edge-sync", server__port=port,
        model_sync={"model_dir": str(tmp_path / "models"), "watch_timeout_s": 0.3,
                    "report_interval_s": 0.3,
                    "local_roots": [str(tmp_path)]},  # the test's own artifact
    )  # fmt: skip
    model = settings.engine.model_name

    async def push_and_desire() -> None:
        r = await open_registry(RegistrySettings.model_validate(reg))
        try:
            store = SyncStore(r, actor="test")
            await ops.push(store, str(stand_in_model), model=model, version="v1")
            await ops.push(store, str(stand_in_model), model=model, version="v2",
                           filename="v2.gguf")  # fmt: skip
            await store.set_desired("edge-sync", model, "v2")
        finally:
            await r.aclose()

    engines = ScriptedEngines()
    app = scripted_app(settings, engines)
    with UvicornThread(app, port=port) as server:
        deadline = time.monotonic() + 60
        while httpx.get(server.url + "/ready").status_code != 200:
            assert time.monotonic() < deadline
            time.sleep(0.1)
        asyncio.run(push_and_desire())
        deadline = time.monotonic() + 90
        while httpx.get(server.url + "/load").json()["version"] != "v2":
            assert time.monotonic() < deadline, "agent never swapped to v2"
            time.sleep(0.2)
        body = {"model": model, "prompt": "Hi", "max_tokens": 2}
        r = httpx.post(server.url + "/v1/completions", json=body, timeout=60)
        assert r.headers["x-model-version"] == "v2"
        assert (tmp_path / "models" / model / "v2" / "v2.gguf").is_file()
        assert [e.version for e in engines.built] == ["v1", "v2"]
        assert engines.current.requests  # the answer came from the new version's engine
