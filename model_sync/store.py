"""Typed access to model_sync's documents in any :class:`~servekit.registry.KVStore`.

Reads return pydantic documents (with the key's modify index where a caller
needs compare-and-swap); writes go through :meth:`SyncStore.update`, a CAS
loop, wherever two writers could race (operators and the controller on a
rollout's state, pushes of the same version).
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable
from typing import TypeVar

from pydantic import BaseModel, ValidationError

from model_sync import keys
from model_sync.records import (
    ActualState,
    AliasRecord,
    ArtifactRecord,
    DesiredState,
    FeedbackCounts,
    HistoryEntry,
    RolloutPlan,
    RolloutState,
    TrafficShares,
)
from servekit.registry.protocol import KVStore

__all__ = ["ConflictError", "StoreError", "SyncStore", "VersionExists"]

_D = TypeVar("_D", bound=BaseModel)


class StoreError(Exception):
    """A stored document is unreadable, or a write kept losing races."""


class ConflictError(StoreError):
    """The change is not allowed in the current state (e.g. another rollout runs)."""


class VersionExists(ConflictError):
    """A version is already registered with a different digest; versions are immutable."""


class SyncStore:
    """model_sync's view of the registry KV. ``actor`` signs history entries."""

    def __init__(self, kv: KVStore, actor: str = "model-sync") -> None:
        self.kv = kv
        self.actor = actor

    # -- generic documents -------------------------------------------------

    async def read(self, key: str, model: type[_D]) -> tuple[_D, int] | None:
        entry = await self.kv.get(key)
        if entry is None:
            return None
        return _parse(key, entry.value, model), entry.modify_index

    async def get(self, key: str, model: type[_D]) -> _D | None:
        found = await self.read(key, model)
        return None if found is None else found[0]

    async def put(self, key: str, doc: BaseModel) -> None:
        await self.kv.put(key, doc.model_dump_json().encode())

    async def update(
        self,
        key: str,
        model: type[_D],
        change: Callable[[_D | None], _D | None],
        *,
        attempts: int = 50,
    ) -> _D | None:
        """Read-modify-write with compare-and-swap; ``change`` returning ``None`` writes nothing.

        ``change`` may raise to refuse the change; it is called again after a lost race.
        """
        for _ in range(attempts):
            found = await self.read(key, model)
            current, index = (None, 0) if found is None else found
            new = change(current)
            if new is None:
                return current
            if await self.kv.put_if(key, new.model_dump_json().encode(), index):
                return new
        raise StoreError(f"{key}: gave up after {attempts} conflicting writes")

    async def list_docs(self, prefix: str, model: type[_D]) -> list[tuple[str, _D]]:
        return [(e.key, _parse(e.key, e.value, model)) for e in await self.kv.list_prefix(prefix)]

    # -- versions and aliases ----------------------------------------------

    async def register(self, record: ArtifactRecord) -> bool:
        """Register a version; ``False`` if the identical artifact was already there."""

        def change(current: ArtifactRecord | None) -> ArtifactRecord | None:
            if current is None:
                return record
            if current.sha256 == record.sha256 and current.size == record.size:
                return None
            raise VersionExists(
                f"{record.name} {record.version} is already registered with sha256 "
                f"{current.sha256[:12]}; publish a new version instead"
            )

        key = keys.version_key(record.name, record.version)
        existed = await self.kv.get(key) is not None
        await self.update(key, ArtifactRecord, change)
        return not existed

    async def artifact(self, name: str, version: str) -> ArtifactRecord | None:
        return await self.get(keys.version_key(name, version), ArtifactRecord)

    async def artifacts(self, name: str | None = None) -> list[ArtifactRecord]:
        prefix = keys.versions_prefix(name) if name else keys.MODELS_PREFIX
        out = []
        for entry in await self.kv.list_prefix(prefix):
            if "/versions/" in entry.key:
                out.append(_parse(entry.key, entry.value, ArtifactRecord))
        return sorted(out, key=lambda r: (r.name, r.created_at))

    async def set_alias(self, name: str, alias: str, version: str) -> None:
        await self.put(
            keys.alias_key(name, alias), AliasRecord(version=version, updated_by=self.actor)
        )

    async def alias(self, name: str, alias: str) -> str | None:
        found = await self.get(keys.alias_key(name, alias), AliasRecord)
        return None if found is None else found.version

    async def aliases(self, name: str) -> dict[str, str]:
        prefix = keys.aliases_prefix(name)
        return {
            key.removeprefix(prefix): rec.version
            for key, rec in await self.list_docs(prefix, AliasRecord)
        }

    async def traffic(self, name: str) -> TrafficShares:
        return await self.get(keys.traffic_key(name), TrafficShares) or TrafficShares()

    async def set_traffic(self, name: str, shares: dict[str, float]) -> None:
        clean = {v: round(f, 6) for v, f in shares.items() if f > 0}
        await self.put(keys.traffic_key(name), TrafficShares(shares=clean))

    async def feedback(self, name: str, version: str) -> FeedbackCounts:
        """Ratings of ``version``'s answers, summed over every router that reported."""
        total = FeedbackCounts()
        for _key, doc in await self.list_docs(keys.feedback_prefix(name, version), FeedbackCounts):
            total.rated += doc.rated
            total.accepted += doc.accepted
        return total

    # -- nodes -------------------------------------------------------------

    async def set_desired(self, node_id: str, model: str, version: str) -> None:
        await self.put(keys.desired_key(node_id), DesiredState(model=model, version=version))

    async def desired(self, node_id: str) -> DesiredState | None:
        return await self.get(keys.desired_key(node_id), DesiredState)

    async def actual(self, node_id: str) -> ActualState | None:
        return await self.get(keys.actual_key(node_id), ActualState)

    async def set_actual(self, node_id: str, actual: ActualState) -> None:
        await self.put(keys.actual_key(node_id), actual)

    async def nodes(self) -> dict[str, tuple[DesiredState | None, ActualState | None]]:
        """Every node with a desired or actual document."""
        out: dict[str, tuple[DesiredState | None, ActualState | None]] = {}
        for entry in await self.kv.list_prefix(keys.NODES_PREFIX):
            node, _, kind = entry.key.removeprefix(keys.NODES_PREFIX).rpartition("/")
            desired, actual = out.get(node, (None, None))
            if kind == "desired":
                desired = _parse(entry.key, entry.value, DesiredState)
            elif kind == "actual":
                actual = _parse(entry.key, entry.value, ActualState)
            else:
                continue
            out[node] = (desired, actual)
        return out

    # -- rollouts ----------------------------------------------------------

    async def plan(self, name: str) -> RolloutPlan | None:
        return await self.get(keys.plan_key(name), RolloutPlan)

    async def state(self, name: str) -> RolloutState | None:
        return await self.get(keys.rollout_state_key(name), RolloutState)

    async def states(self) -> list[RolloutState]:
        return [
            _parse(e.key, e.value, RolloutState)
            for e in await self.kv.list_prefix(keys.ROLLOUTS_PREFIX)
            if e.key.endswith("/state")
        ]

    # -- history -----------------------------------------------------------

    def entry(self, action: str, **fields: object) -> HistoryEntry:
        """A new history entry signed by this store's actor (not yet written)."""
        return HistoryEntry.model_validate(
            {"id": uuid.uuid4().hex, "at": time.time(), "actor": self.actor, "action": action}
            | fields
        )

    async def write_history(self, entry: HistoryEntry) -> None:
        """Idempotent: the key derives from the entry's own time and id."""
        await self.put(keys.history_key(entry.at, entry.id), entry)

    async def record(self, action: str, **fields: object) -> HistoryEntry:
        entry = self.entry(action, **fields)
        await self.write_history(entry)
        return entry

    async def history(self, model: str | None = None, limit: int = 50) -> list[HistoryEntry]:
        entries = [doc for _, doc in await self.list_docs(keys.HISTORY_PREFIX, HistoryEntry)]
        entries.sort(key=lambda e: e.at)
        if model:
            entries = [e for e in entries if e.model == model]
        return entries[-limit:] if limit else entries


def _parse(key: str, raw: bytes, model: type[_D]) -> _D:
    try:
        return model.model_validate_json(raw)
    except ValidationError as exc:
        raise StoreError(f"{key}: not a valid {model.__name__}: {exc}") from None
