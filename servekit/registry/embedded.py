"""The embedded registry: one SQLite file that several processes on one machine share.

How the file is shared safely (WAL, ``BEGIN IMMEDIATE``, ``busy_timeout``,
worker threads, error translation) lives in :mod:`servekit.registry.sqlite_file`;
this module is the registry's schema and semantics.

One monotonic counter (``counters.index``) is bumped by every write; catalog
writes also copy it to ``counters.catalog`` and KV writes stamp it on the key
(deletes leave a tombstone), so a blocking query is a cheap poll of one row
every ``poll_interval_s`` until the index it cares about moves.

Expiry follows Consul: an instance not heartbeated within its TTL turns
critical (no longer listed as healthy, but a heartbeat revives it) and is
removed ``deregister_after_s`` later (a heartbeat then raises
:class:`NotRegistered`). Whichever reader first notices a deadline passed
writes the transition, so watchers wake on expiry too.

Locks are rows with a holder, a lease id and ``expires_at``; an expired lock
is free for the next taker, and its old handle can no longer renew.
"""

from __future__ import annotations

import asyncio
import sqlite3
import time
import uuid
from pathlib import Path
from typing import Any

from servekit.engine.protocol import LoadReport
from servekit.registry.codec import info_from_json, info_to_json, load_from_json, load_to_json
from servekit.registry.protocol import (
    InstanceInfo,
    InstanceState,
    KVEntry,
    LockHandle,
    NotRegistered,
    Tier,
)
from servekit.registry.sqlite_file import SharedSqlite, transaction

__all__ = ["EmbeddedRegistry"]

_SCHEMA = """
BEGIN IMMEDIATE;
CREATE TABLE IF NOT EXISTS counters (name TEXT PRIMARY KEY, value INTEGER NOT NULL);
INSERT OR IGNORE INTO counters (name, value) VALUES ('index', 1), ('catalog', 1);
CREATE TABLE IF NOT EXISTS instances (
    id TEXT PRIMARY KEY,
    info TEXT NOT NULL,
    load TEXT NOT NULL,
    ttl_s REAL NOT NULL,
    last_heartbeat REAL NOT NULL,
    expires_at REAL NOT NULL,
    critical INTEGER NOT NULL DEFAULT 0,
    modify_index INTEGER NOT NULL
);
CREATE TABLE IF NOT EXISTS kv (
    key TEXT PRIMARY KEY,
    value BLOB NOT NULL,
    create_index INTEGER NOT NULL,
    modify_index INTEGER NOT NULL
);
CREATE TABLE IF NOT EXISTS kv_tombstones (key TEXT PRIMARY KEY, modify_index INTEGER NOT NULL);
CREATE TABLE IF NOT EXISTS locks (
    key TEXT PRIMARY KEY,
    holder TEXT NOT NULL,
    session TEXT NOT NULL,
    expires_at REAL NOT NULL
);
COMMIT;
"""

_PREFIX = "substr(key, 1, ?) = ?"


class EmbeddedRegistry:
    """:class:`~servekit.registry.protocol.Registry` over a shared SQLite file.

    ``deregister_after_s`` is how long an expired (critical) instance stays
    listed as unhealthy before it is removed; ``poll_interval_s`` bounds how
    late a watch wakes after a change; ``busy_timeout_s`` is how long a write
    waits for another process's transaction before the store counts as
    unavailable.
    """

    def __init__(
        self,
        path: str | Path,
        *,
        deregister_after_s: float = 60.0,
        poll_interval_s: float = 0.05,
        busy_timeout_s: float = 5.0,
    ) -> None:
        self.path = Path(path)
        self.deregister_after_s = deregister_after_s
        self.poll_interval_s = poll_interval_s
        self.busy_timeout_s = busy_timeout_s
        self._db = SharedSqlite(self.path, _SCHEMA, busy_timeout_s=busy_timeout_s)

    @staticmethod
    def _bump(conn: sqlite3.Connection, *, catalog: bool = False) -> int:
        row = conn.execute(
            "UPDATE counters SET value = value + 1 WHERE name = 'index' RETURNING value"
        ).fetchone()
        index = int(row[0])
        if catalog:
            conn.execute("UPDATE counters SET value = ? WHERE name = 'catalog'", (index,))
        return index

    async def aclose(self) -> None:
        await self._db.aclose()

    # -- catalog ----------------------------------------------------------

    async def register(self, info: InstanceInfo, ttl_s: float) -> None:
        def op(conn: sqlite3.Connection) -> None:
            now = time.time()
            index = self._bump(conn, catalog=True)
            conn.execute(
                "INSERT INTO instances (id, info, load, ttl_s, last_heartbeat, expires_at,"
                " critical, modify_index) VALUES (?, ?, ?, ?, ?, ?, 0, ?)"
                " ON CONFLICT(id) DO UPDATE SET info = excluded.info, ttl_s = excluded.ttl_s,"
                " last_heartbeat = excluded.last_heartbeat, expires_at = excluded.expires_at,"
                " critical = 0, modify_index = excluded.modify_index",
                (info.id, info_to_json(info), load_to_json(LoadReport()), ttl_s, now, now + ttl_s,
                 index),
            )  # fmt: skip

        await self._db.write(op)

    async def heartbeat(self, instance_id: str, load: LoadReport) -> None:
        def op(conn: sqlite3.Connection) -> bool:
            now = time.time()
            found = conn.execute(
                "SELECT 1 FROM instances WHERE id = ? AND expires_at + ? > ?",
                (instance_id, self.deregister_after_s, now),
            ).fetchone()
            if found is None:
                return False
            index = self._bump(conn, catalog=True)
            conn.execute(
                "UPDATE instances SET load = ?, last_heartbeat = ?, expires_at = ? + ttl_s,"
                " critical = 0, modify_index = ? WHERE id = ?",
                (load_to_json(load), now, now, index, instance_id),
            )
            return True

        if not await self._db.write(op):
            raise NotRegistered(instance_id)

    async def deregister(self, instance_id: str) -> None:
        def op(conn: sqlite3.Connection) -> None:
            if conn.execute("SELECT 1 FROM instances WHERE id = ?", (instance_id,)).fetchone():
                self._bump(conn, catalog=True)
                conn.execute("DELETE FROM instances WHERE id = ?", (instance_id,))

        await self._db.write(op)

    async def instances(
        self, *, tier: Tier | None = None, region: str | None = None, healthy_only: bool = True
    ) -> list[InstanceState]:
        states = await self._db.run(self._read_instances)
        return [
            s
            for s in states
            if (tier is None or s.info.tier == tier)
            and (region is None or s.info.region == region)
            and (s.healthy or not healthy_only)
        ]

    def _read_instances(self, conn: sqlite3.Connection) -> list[InstanceState]:
        now = time.time()
        rows = conn.execute(
            "SELECT info, load, last_heartbeat, expires_at, critical FROM instances"
            " WHERE expires_at + ? > ? ORDER BY id",
            (self.deregister_after_s, now),
        ).fetchall()
        return [
            InstanceState(
                info=info_from_json(info),
                load=load_from_json(load),
                healthy=not critical and expires_at > now,
                last_heartbeat=last,
            )
            for info, load, last, expires_at, critical in rows
        ]

    async def watch_instances(
        self, index: int, timeout_s: float
    ) -> tuple[int, list[InstanceState]]:
        deadline = time.monotonic() + timeout_s
        while True:
            current = await self._db.run(self._catalog_index)
            if current != index or time.monotonic() >= deadline:
                return current, await self.instances()
            await asyncio.sleep(min(self.poll_interval_s, max(0.0, deadline - time.monotonic())))

    def _catalog_index(self, conn: sqlite3.Connection) -> int:
        """The catalog index, after writing any expiry transition that is due."""
        now = time.time()
        index, next_expiry, next_removal = conn.execute(
            "SELECT (SELECT value FROM counters WHERE name = 'catalog'),"
            " (SELECT min(expires_at) FROM instances WHERE critical = 0),"
            " (SELECT min(expires_at) + ? FROM instances)",
            (self.deregister_after_s,),
        ).fetchone()
        due = (next_expiry is not None and next_expiry <= now) or (
            next_removal is not None and next_removal <= now
        )
        if not due:
            return int(index)
        return transaction(conn, self._sweep)

    def _sweep(self, conn: sqlite3.Connection) -> int:
        now = time.time()
        changed = conn.execute(
            "SELECT count(*) FROM instances WHERE (critical = 0 AND expires_at <= ?)"
            " OR expires_at + ? <= ?",
            (now, self.deregister_after_s, now),
        ).fetchone()[0]
        if not changed:  # another process swept first
            return int(
                conn.execute("SELECT value FROM counters WHERE name = 'catalog'").fetchone()[0]
            )
        index = self._bump(conn, catalog=True)
        conn.execute(
            "UPDATE instances SET critical = 1, modify_index = ?"
            " WHERE critical = 0 AND expires_at <= ?",
            (index, now),
        )
        conn.execute(
            "DELETE FROM instances WHERE expires_at + ? <= ?", (self.deregister_after_s, now)
        )
        return index

    # -- KV ---------------------------------------------------------------

    async def get(self, key: str) -> KVEntry | None:
        def op(conn: sqlite3.Connection) -> KVEntry | None:
            row = conn.execute(
                "SELECT key, value, modify_index, create_index FROM kv WHERE key = ?", (key,)
            ).fetchone()
            return _entry(row) if row else None

        return await self._db.run(op)

    async def put(self, key: str, value: bytes) -> None:
        await self._db.write(lambda conn: self._put(conn, key, value))

    def _put(self, conn: sqlite3.Connection, key: str, value: bytes) -> None:
        index = self._bump(conn)
        conn.execute(
            "INSERT INTO kv (key, value, create_index, modify_index) VALUES (?, ?, ?, ?)"
            " ON CONFLICT(key) DO UPDATE SET value = excluded.value,"
            " modify_index = excluded.modify_index",
            (key, bytes(value), index, index),
        )
        conn.execute("DELETE FROM kv_tombstones WHERE key = ?", (key,))

    async def put_if(self, key: str, value: bytes, modify_index: int) -> bool:
        def op(conn: sqlite3.Connection) -> bool:
            row = conn.execute("SELECT modify_index FROM kv WHERE key = ?", (key,)).fetchone()
            current = int(row[0]) if row else 0
            if current != modify_index:
                return False
            self._put(conn, key, value)
            return True

        return await self._db.write(op)

    async def delete(self, key: str) -> None:
        def op(conn: sqlite3.Connection) -> None:
            if conn.execute("SELECT 1 FROM kv WHERE key = ?", (key,)).fetchone():
                index = self._bump(conn)
                conn.execute("DELETE FROM kv WHERE key = ?", (key,))
                conn.execute(
                    "INSERT OR REPLACE INTO kv_tombstones (key, modify_index) VALUES (?, ?)",
                    (key, index),
                )

        await self._db.write(op)

    async def list_prefix(self, prefix: str) -> list[KVEntry]:
        return await self._db.run(lambda conn: self._list(conn, prefix))

    @staticmethod
    def _list(conn: sqlite3.Connection, prefix: str) -> list[KVEntry]:
        rows = conn.execute(
            f"SELECT key, value, modify_index, create_index FROM kv WHERE {_PREFIX} ORDER BY key",
            (len(prefix), prefix),
        ).fetchall()
        return [_entry(r) for r in rows]

    async def watch_prefix(
        self, prefix: str, index: int, timeout_s: float
    ) -> tuple[int, list[KVEntry]]:
        deadline = time.monotonic() + timeout_s
        while True:
            current, entries = await self._db.run(lambda conn: self._prefix_state(conn, prefix))
            if current != index or time.monotonic() >= deadline:
                return current, entries
            await asyncio.sleep(min(self.poll_interval_s, max(0.0, deadline - time.monotonic())))

    def _prefix_state(self, conn: sqlite3.Connection, prefix: str) -> tuple[int, list[KVEntry]]:
        # Like Consul: the prefix's own index (deletes included), or the
        # store's index while nothing under the prefix ever existed.
        conn.execute("BEGIN")
        try:
            (index,) = conn.execute(
                f"SELECT max(coalesce((SELECT max(modify_index) FROM kv WHERE {_PREFIX}), 0),"
                f" coalesce((SELECT max(modify_index) FROM kv_tombstones WHERE {_PREFIX}), 0))",
                (len(prefix), prefix, len(prefix), prefix),
            ).fetchone()
            if not index:
                (index,) = conn.execute(
                    "SELECT value FROM counters WHERE name = 'index'"
                ).fetchone()
            entries = self._list(conn, prefix)
        finally:
            conn.execute("COMMIT")
        return int(index), entries

    # -- locks ------------------------------------------------------------

    async def acquire_lock(self, key: str, holder: str, ttl_s: float) -> LockHandle | None:
        def op(conn: sqlite3.Connection) -> LockHandle | None:
            now = time.time()
            row = conn.execute("SELECT expires_at FROM locks WHERE key = ?", (key,)).fetchone()
            if row is not None and row[0] > now:
                return None
            session = uuid.uuid4().hex
            conn.execute(
                "INSERT OR REPLACE INTO locks (key, holder, session, expires_at)"
                " VALUES (?, ?, ?, ?)",
                (key, holder, session, now + ttl_s),
            )
            return LockHandle(key=key, holder=holder, session=session, ttl_s=ttl_s)

        return await self._db.write(op)

    async def renew_lock(self, lock: LockHandle) -> bool:
        def op(conn: sqlite3.Connection) -> bool:
            now = time.time()
            cur = conn.execute(
                "UPDATE locks SET expires_at = ? WHERE key = ? AND session = ? AND expires_at > ?",
                (now + lock.ttl_s, lock.key, lock.session, now),
            )
            return cur.rowcount == 1

        return await self._db.write(op)

    async def release_lock(self, lock: LockHandle) -> None:
        await self._db.write(
            lambda conn: conn.execute(
                "DELETE FROM locks WHERE key = ? AND session = ?", (lock.key, lock.session)
            )
        )


def _entry(row: tuple[Any, ...]) -> KVEntry:
    key, value, modify_index, create_index = row
    return KVEntry(
        key=key, value=bytes(value), modify_index=int(modify_index), create_index=int(create_index)
    )
