"""One SQLite file that several processes share safely, used from asyncio.

Why it is safe across processes: WAL mode (readers never block the writer),
every write is one short ``BEGIN IMMEDIATE`` transaction (the write lock is
taken up front, so two writers never deadlock upgrading a read lock), and
``busy_timeout`` makes a writer wait its turn instead of failing.

Every sqlite call runs in a worker thread on this object's one connection
(serialised by a lock); the event loop never touches the file. ``sqlite3``
errors become :class:`RegistryUnavailable` here and nowhere else; the
connection is dropped and reopened on the next call.
"""

from __future__ import annotations

import asyncio
import sqlite3
import threading
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

from servekit.registry.protocol import RegistryUnavailable

__all__ = ["SharedSqlite", "transaction"]

_T = TypeVar("_T")


def transaction(conn: sqlite3.Connection, fn: Callable[[sqlite3.Connection], _T]) -> _T:
    """Run ``fn`` inside ``BEGIN IMMEDIATE`` … ``COMMIT`` (rolled back on error)."""
    conn.execute("BEGIN IMMEDIATE")
    try:
        result = fn(conn)
    except BaseException:
        if conn.in_transaction:
            conn.execute("ROLLBACK")
        raise
    conn.execute("COMMIT")
    return result


class SharedSqlite:
    """A lazily opened connection to ``path``; ``schema`` runs on every open
    and must be idempotent (``CREATE TABLE IF NOT EXISTS``)."""

    def __init__(self, path: str | Path, schema: str, *, busy_timeout_s: float = 5.0) -> None:
        self.path = Path(path)
        self.schema = schema
        self.busy_timeout_s = busy_timeout_s
        self._conn: sqlite3.Connection | None = None
        self._lock = threading.Lock()
        self._closed = False

    async def run(self, fn: Callable[[sqlite3.Connection], _T]) -> _T:
        """Call ``fn(connection)`` in a worker thread (autocommit: one
        statement is one transaction unless ``fn`` opens its own)."""
        if self._closed:
            raise RegistryUnavailable(f"{self.path} is closed")
        return await asyncio.to_thread(self._locked, fn)

    async def write(self, fn: Callable[[sqlite3.Connection], _T]) -> _T:
        """Call ``fn(connection)`` inside one short write transaction."""
        return await self.run(lambda conn: transaction(conn, fn))

    async def aclose(self) -> None:
        if not self._closed:
            self._closed = True
            await asyncio.to_thread(self._close_now)

    def _close_now(self) -> None:
        with self._lock:
            self._drop()

    def _locked(self, fn: Callable[[sqlite3.Connection], _T]) -> _T:
        with self._lock:
            try:
                if self._conn is None:
                    self._conn = self._connect()
                return fn(self._conn)
            except sqlite3.Error as exc:
                self._drop()
                raise RegistryUnavailable(f"embedded registry {self.path}: {exc}") from exc

    def _connect(self) -> sqlite3.Connection:
        conn = sqlite3.connect(
            self.path, timeout=self.busy_timeout_s, isolation_level=None, check_same_thread=False
        )
        try:
            conn.execute(f"PRAGMA busy_timeout = {int(self.busy_timeout_s * 1000)}")
            conn.execute("PRAGMA journal_mode = WAL")
            conn.execute("PRAGMA synchronous = NORMAL")
            conn.executescript(self.schema)
        except BaseException:
            conn.close()
            raise
        return conn

    def _drop(self) -> None:
        if self._conn is None:
            return
        try:
            if self._conn.in_transaction:
                self._conn.execute("ROLLBACK")
            self._conn.close()
        except sqlite3.Error:
            pass
        self._conn = None
