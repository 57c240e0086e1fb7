from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path

import anyio
import anyio.to_thread
import pytest

from hybrid_llm.local.servers import UvicornThread
from model_sync.agent import Reconciler
from model_sync.artifacts import create_app
from model_sync.download import Downloader
from model_sync.modeldir import ModelDir
from model_sync.records import ActualState
from model_sync.store import SyncStore
from servekit.engine.protocol import LoadReport
from servekit.modelfetch import sha256_file
from servekit.registry import Registry
from tests.model_sync.helpers import SlowBody, make_artifact, record_for

pytestmark = pytest.mark.anyio


class RecordingSwap:
    """The edge agent's swap, reduced to what the reconciler can observe: it
    reads the file it was given and fails for versions it is told to."""

    def __init__(self, fail: set[str] | None = None) -> None:
        self.calls: list[tuple[str, str]] = []
        self.fail = fail or set()

    async def __call__(self, path: Path, version: str) -> None:
        digest = await anyio.to_thread.run_sync(sha256_file, path)
        if version in self.fail:
            raise RuntimeError(f"failed to load model from file: {path.name}")
        self.calls.append((version, digest))


async def wait_actual(
    store: SyncStore, node: str, cond: Callable[[ActualState], bool], within: float = 10.0
) -> ActualState:
    with anyio.fail_after(within):
        while True:
            actual = await store.actual(node)
            if actual is not None and cond(actual):
                return actual
            await anyio.sleep(0.02)


@asynccontextmanager
async def running(rec: Reconciler) -> AsyncIterator[None]:
    async with anyio.create_task_group() as tg:
        tg.start_soon(rec.run)
        try:
            yield
        finally:
            tg.cancel_scope.cancel()


async def publish(store: SyncStore, tmp: Path, version: str, size: int = 200_000) -> str:
    data, digest = make_artifact(tmp / "src" / version / "m.gguf", size)
    await store.register(record_for("tiny", version, str(tmp / "src" / version / "m.gguf"), data))
    return digest


def reconciler(reg: Registry, tmp: Path, swap: RecordingSwap, **kw: object) -> Reconciler:
    return Reconciler(
        reg,
        "edge-1",
        tmp / "models",
        swap,
        model="tiny",
        version="v1",
        watch_timeout_s=0.2,
        progress_interval_s=0.01,
        stats=lambda: LoadReport(requests_ok=7, requests_failed=1, ttft_p95_ms=42.0),
        **kw,  # type: ignore[arg-type]
    )


async def test_swaps_to_desired_and_reports(tmp_path: Path, registry: Registry) -> None:
    reg = registry
    store = SyncStore(reg)
    digest = await publish(store, tmp_path, "v2")
    swap = RecordingSwap()
    async with running(reconciler(reg, tmp_path, swap)):
        first = await wait_actual(store, "edge-1", lambda a: a.version == "v1")
        assert first.state == "serving"
        assert first.requests_ok == 7
        await store.set_desired("edge-1", "tiny", "v2")
        actual = await wait_actual(store, "edge-1", lambda a: a.version == "v2")
    assert swap.calls == [("v2", digest)]
    assert actual.state == "serving"
    assert actual.error is None
    assert actual.ttft_p95_ms == 42.0
    assert (tmp_path / "models" / "tiny" / "v2" / "model.gguf").is_file()


async def test_corrupt_artifact_is_never_swapped_in(tmp_path: Path, registry: Registry) -> None:
    reg = registry
    store = SyncStore(reg)
    await publish(store, tmp_path, "v2")
    (tmp_path / "src" / "v2" / "m.gguf").write_bytes(b"\0" * 200_000)  # same size, wrong bytes
    swap = RecordingSwap()
    async with running(reconciler(reg, tmp_path, swap)):
        await store.set_desired("edge-1", "tiny", "v2")
        actual = await wait_actual(store, "edge-1", lambda a: a.state == "failed")
    assert swap.calls == []
    assert actual.version == "v1"
    assert actual.target == "v2"
    assert actual.error is not None
    assert "sha256 does not match" in actual.error
    assert not (tmp_path / "models" / "tiny" / "v2").exists()


async def test_failed_load_keeps_old_version_serving(tmp_path: Path, registry: Registry) -> None:
    reg = registry
    store = SyncStore(reg)
    await publish(store, tmp_path, "v2")
    swap = RecordingSwap(fail={"v2"})
    async with running(reconciler(reg, tmp_path, swap)):
        await store.set_desired("edge-1", "tiny", "v2")
        actual = await wait_actual(store, "edge-1", lambda a: a.state == "failed")
    assert actual.version == "v1"
    assert actual.error == "RuntimeError: failed to load model from file: model.gguf"


async def test_disk_full_reported_and_old_version_serves(
    tmp_path: Path, registry: Registry
) -> None:
    reg = registry
    store = SyncStore(reg)
    await publish(store, tmp_path, "v2", size=300_000)
    swap = RecordingSwap()
    models = ModelDir(tmp_path / "models")
    rec = reconciler(reg, tmp_path, swap, downloader=Downloader(models, free_space=lambda _: 4096))
    async with running(rec):
        await store.set_desired("edge-1", "tiny", "v2")
        actual = await wait_actual(store, "edge-1", lambda a: a.state == "failed")
    assert swap.calls == []
    assert actual.version == "v1"
    assert actual.error is not None
    assert actual.error.startswith("InsufficientSpace: not enough disk space")
    assert "0.3 MiB" in actual.error


async def test_unregistered_version_fails_clearly(tmp_path: Path, registry: Registry) -> None:
    reg = registry
    store = SyncStore(reg)
    async with running(reconciler(reg, tmp_path, RecordingSwap())):
        await store.set_desired("edge-1", "tiny", "v9")
        actual = await wait_actual(store, "edge-1", lambda a: a.state == "failed")
    assert actual.error == "LookupError: tiny v9 is not a registered version"


async def test_rollback_uses_kept_version_and_gc_drops_older(
    tmp_path: Path, registry: Registry
) -> None:
    reg = registry
    store = SyncStore(reg)
    for v in ("v2", "v3", "v4"):
        await publish(store, tmp_path, v, size=50_000)
    swap = RecordingSwap()
    async with running(reconciler(reg, tmp_path, swap)):
        for v in ("v2", "v3"):
            await store.set_desired("edge-1", "tiny", v)
            await wait_actual(store, "edge-1", lambda a, v=v: a.version == v)  # type: ignore[misc]
        # The source of v2 disappears: rolling back must not need it.
        (tmp_path / "src" / "v2" / "m.gguf").unlink()
        await store.set_desired("edge-1", "tiny", "v2")
        await wait_actual(store, "edge-1", lambda a: a.version == "v2")
        await store.set_desired("edge-1", "tiny", "v4")
        await wait_actual(store, "edge-1", lambda a: a.version == "v4")
    assert [v for v, _ in swap.calls] == ["v2", "v3", "v2", "v4"]
    # Serving v4, previous v2 kept for instant rollback, v3 collected.
    assert sorted(ModelDir(tmp_path / "models").installed("tiny")) == ["v2", "v4"]


async def test_rollback_during_download_abandons_it(tmp_path: Path, registry: Registry) -> None:
    reg = registry
    store = SyncStore(reg)
    root = tmp_path / "served"
    data, _ = make_artifact(root / "m.gguf", 2_000_000)
    swap = RecordingSwap()
    with UvicornThread(SlowBody(create_app(root), delay_s=0.05)) as server:
        await store.register(record_for("tiny", "v2", f"{server.url}/m.gguf", data))
        async with running(reconciler(reg, tmp_path, swap)):
            await store.set_desired("edge-1", "tiny", "v2")
            await wait_actual(store, "edge-1", lambda a: a.state == "downloading")
            await store.set_desired("edge-1", "tiny", "v1")
            actual = await wait_actual(
                store, "edge-1", lambda a: a.state == "serving" and a.target is None
            )
    assert actual.version == "v1"
    assert swap.calls == []
    assert not (tmp_path / "models" / "tiny" / "v2").exists()


async def test_unreadable_desired_is_reported_then_recovered(
    tmp_path: Path, registry: Registry
) -> None:
    from model_sync.keys import desired_key

    store = SyncStore(registry)
    digest = await publish(store, tmp_path, "v2")
    swap = RecordingSwap()
    async with running(reconciler(registry, tmp_path, swap)):
        await registry.put(desired_key("edge-1"), b'{"model": "tiny"}')
        bad = await wait_actual(store, "edge-1", lambda a: a.state == "failed")
        assert bad.error is not None
        assert bad.error.startswith("invalid desired state")
        await store.set_desired("edge-1", "tiny", "v2")
        await wait_actual(store, "edge-1", lambda a: a.version == "v2")
    assert swap.calls == [("v2", digest)]
