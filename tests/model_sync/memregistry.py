"""A minimal in-memory Registry (catalog + KV) for unit tests, until the embedded
backend lands. Same semantics as the protocol: modify indexes, CAS, blocking
watches, leases that expire."""

from __future__ import annotations

import asyncio
import time
import uuid

import anyio

from servekit.engine.protocol import LoadReport
from servekit.registry.protocol import InstanceInfo, InstanceState, KVEntry, LockHandle, Tier


class MemRegistry:
    def __init__(self) -> None:
        self._data: dict[str, KVEntry] = {}
        self._index = 1
        self._changed = asyncio.Event()  # replaced by a fresh one after each change
        self._changes: dict[str, int] = {}  # key -> index of its last write or delete
        self._locks: dict[str, tuple[LockHandle, float]] = {}
        self._instances: dict[str, tuple[InstanceInfo, LoadReport, float, float]] = {}

    async def _bump(self, key: str = "") -> int:
        self._index += 1
        self._changes[key] = self._index
        self._changed.set()
        self._changed = asyncio.Event()
        return self._index

    # -- KV ----------------------------------------------------------------
    async def get(self, key: str) -> KVEntry | None:
        return self._data.get(key)

    async def put(self, key: str, value: bytes) -> None:
        old = self._data.get(key)
        index = self._index + 1
        self._data[key] = KVEntry(key, value, index, old.create_index if old else index)
        await self._bump(key)

    async def put_if(self, key: str, value: bytes, modify_index: int) -> bool:
        old = self._data.get(key)
        if (old.modify_index if old else 0) != modify_index:
            return False
        await self.put(key, value)
        return True

    async def delete(self, key: str) -> None:
        if self._data.pop(key, None) is not None:
            await self._bump(key)

    async def list_prefix(self, prefix: str) -> list[KVEntry]:
        return [e for k, e in sorted(self._data.items()) if k.startswith(prefix)]

    async def watch_prefix(
        self, prefix: str, index: int, timeout_s: float
    ) -> tuple[int, list[KVEntry]]:
        deadline = time.monotonic() + timeout_s
        while index and self._prefix_index(prefix) <= index:
            left = deadline - time.monotonic()
            if left <= 0:
                break
            with anyio.move_on_after(left):
                await self._changed.wait()
        return self._index, await self.list_prefix(prefix)

    def _prefix_index(self, prefix: str) -> int:
        return max((i for k, i in self._changes.items() if k.startswith(prefix)), default=0)

    async def acquire_lock(self, key: str, holder: str, ttl_s: float) -> LockHandle | None:
        held = self._locks.get(key)
        if held and held[1] > time.monotonic():
            return None
        handle = LockHandle(key, holder, uuid.uuid4().hex, ttl_s)
        self._locks[key] = (handle, time.monotonic() + ttl_s)
        return handle

    async def renew_lock(self, lock: LockHandle) -> bool:
        held = self._locks.get(lock.key)
        if not held or held[0].session != lock.session or held[1] < time.monotonic():
            return False
        self._locks[lock.key] = (lock, time.monotonic() + lock.ttl_s)
        return True

    async def release_lock(self, lock: LockHandle) -> None:
        held = self._locks.get(lock.key)
        if held and held[0].session == lock.session:
            del self._locks[lock.key]

    # -- catalog -----------------------------------------------------------
    async def register(self, info: InstanceInfo, ttl_s: float) -> None:
        self._instances[info.id] = (info, LoadReport(), ttl_s, time.time())
        await self._bump()

    async def heartbeat(self, instance_id: str, load: LoadReport) -> None:
        info, _, ttl, _ = self._instances[instance_id]
        self._instances[instance_id] = (info, load, ttl, time.time())

    async def deregister(self, instance_id: str) -> None:
        self._instances.pop(instance_id, None)
        await self._bump()

    async def instances(
        self, *, tier: Tier | None = None, region: str | None = None, healthy_only: bool = True
    ) -> list[InstanceState]:
        out = []
        for info, load, ttl, beat in self._instances.values():
            healthy = time.time() - beat < ttl
            if (tier and info.tier != tier) or (region and info.region != region):
                continue
            if healthy_only and not healthy:
                continue
            out.append(InstanceState(info, load, healthy, beat))
        return sorted(out, key=lambda s: s.info.id)

    async def watch_instances(
        self, index: int, timeout_s: float
    ) -> tuple[int, list[InstanceState]]:
        return self._index, await self.instances()

    async def aclose(self) -> None:
        pass
