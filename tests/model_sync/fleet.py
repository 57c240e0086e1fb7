"""A small fleet of simulated edge nodes for controller tests.

Each node runs the real :class:`Reconciler` (download, verify, report) against
the registry under test; only the engine is simulated: its swap records the
version, and a traffic loop counts requests whose outcome and TTFT depend on
the version served, published through catalog heartbeats like an edge agent.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Iterable
from contextlib import asynccontextmanager
from pathlib import Path

import anyio

from model_sync.agent import Reconciler
from model_sync.ops import push
from model_sync.records import RolloutState
from model_sync.store import SyncStore
from servekit.engine.protocol import LoadReport
from servekit.registry.protocol import InstanceInfo, Registry
from tests.model_sync.helpers import make_artifact


class SimNode:
    def __init__(
        self,
        registry: Registry,
        node_id: str,
        region: str,
        model_dir: Path,
        *,
        error_rate: dict[str, float],
        ttft_ms: dict[str, float],
        broken: set[str],
    ) -> None:
        self.registry = registry
        self.info = InstanceInfo(
            id=node_id,
            tier="edge",
            region=region,
            address="127.0.0.1",
            port=1,
            model="tiny",
            version="v1",
        )
        self.version = "v1"
        self.ok = self.failed = 0
        self._debt = 0.0
        self.error_rate, self.ttft_ms, self.broken = error_rate, ttft_ms, broken
        self.swaps: list[str] = []
        self.reconciler = Reconciler(
            registry,
            node_id,
            model_dir,
            self.swap,
            model="tiny",
            version="v1",
            stats=self.load,
            watch_timeout_s=0.1,
            report_interval_s=0.1,
            progress_interval_s=0.05,
        )

    async def swap(self, path: Path, version: str) -> None:
        if version in self.broken:
            raise RuntimeError(f"llama_model_load: invalid magic in {path.name}")
        self.swaps.append(version)
        self.version = version

    def load(self) -> LoadReport:
        return LoadReport(
            ready=True,
            model="tiny",
            version=self.version,
            requests_ok=self.ok,
            requests_failed=self.failed,
            ttft_p95_ms=self.ttft_ms.get(self.version, 100.0),
        )

    async def traffic(self, per_tick: int = 5, tick_s: float = 0.02) -> None:
        while True:
            self._debt += per_tick * self.error_rate.get(self.version, 0.0)
            failed = int(self._debt)
            self._debt -= failed
            self.failed += failed
            self.ok += per_tick - failed
            await self.registry.heartbeat(self.info.id, self.load())
            await anyio.sleep(tick_s)


class Fleet:
    def __init__(self, registry: Registry, root: Path, **behaviour: object) -> None:
        self.registry = registry
        self.root = root
        self.store = SyncStore(registry, actor="alice")
        self.nodes = [
            SimNode(registry, nid, region, root / "nodes" / nid, **behaviour)  # type: ignore[arg-type]
            for nid, region in (
                ("edge-a1", "a"),
                ("edge-a2", "a"),
                ("edge-b1", "b"),
                ("edge-b2", "b"),
            )
        ]

    async def publish(self, *versions: str) -> None:
        for v in versions:
            path = self.root / "artifacts" / v / "tiny.gguf"
            make_artifact(path, 30_000)
            await push(self.store, str(path), model="tiny", version=v)

    @asynccontextmanager
    async def running(self) -> AsyncIterator[None]:
        for node in self.nodes:
            await self.registry.register(node.info, ttl_s=30)
        async with anyio.create_task_group() as tg:
            for node in self.nodes:
                tg.start_soon(node.reconciler.run)
                tg.start_soon(node.traffic)
            try:
                yield
            finally:
                tg.cancel_scope.cancel()

    def versions(self) -> dict[str, str]:
        return {n.info.id: n.version for n in self.nodes}


async def wait_state(
    store: SyncStore,
    model: str,
    cond: Callable[[RolloutState], bool],
    within: float = 20.0,
) -> RolloutState:
    with anyio.fail_after(within):
        while True:
            state = await store.state(model)
            # A finished rollout's last history entries are flushed from its
            # outbox on the controller's next tick: wait for them too.
            if state is not None and cond(state) and (state.active or not state.outbox):
                return state
            await anyio.sleep(0.02)


async def wait_history(store: SyncStore, model: str, last: str, within: float = 20.0) -> None:
    """History is flushed through an outbox after the state it records: wait for it."""
    with anyio.fail_after(within):
        while True:
            entries = actions(await store.history(model))
            if entries and entries[-1].startswith(last):
                return
            await anyio.sleep(0.02)


def actions(entries: Iterable[object]) -> list[str]:
    out = []
    for e in entries:
        action, detail = getattr(e, "action", ""), getattr(e, "detail", "")
        short = detail.split(":")[0].split(";")[0]
        out.append(f"{action}:{short}" if detail and action != "push" else action)
    return out
