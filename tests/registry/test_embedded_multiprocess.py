"""Two processes share one embedded registry file: no lost update, one lock holder."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from pathlib import Path

from hybrid_llm.local.servers import REPO
from servekit.registry.embedded import EmbeddedRegistry
from servekit.registry.protocol import KVEntry

N = 150


async def _put(db: Path, key: str, value: bytes) -> None:
    registry = EmbeddedRegistry(db)
    await registry.put(key, value)
    await registry.aclose()


async def _get(db: Path, key: str) -> KVEntry | None:
    registry = EmbeddedRegistry(db)
    try:
        return await registry.get(key)
    finally:
        await registry.aclose()


def test_two_processes_race_cas_and_lock_without_lost_updates(tmp_path: Path) -> None:
    db, go = tmp_path / "shared.db", tmp_path / "go"
    asyncio.run(_put(db, "race/setup", b"1"))  # create the schema before the race
    env = dict(os.environ, PYTHONPATH=str(REPO))
    racers = [
        subprocess.Popen(
            [sys.executable, "-m", "tests.registry.race_worker", str(db), str(N), str(go)],
            cwd=REPO,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
        for _ in range(2)
    ]
    go.touch()
    reports = []
    try:
        for proc in racers:
            out, err = proc.communicate(timeout=120)
            assert proc.returncode == 0, err.decode()
            reports.append(json.loads(out))
    finally:
        for proc in racers:
            if proc.poll() is None:
                proc.kill()
                proc.wait()

    cas = asyncio.run(_get(db, "race/cas"))
    locked = asyncio.run(_get(db, "race/locked"))
    assert cas is not None
    assert locked is not None
    assert int(cas.value) == 2 * N  # every CAS increment landed exactly once
    assert int(locked.value) == 2 * N  # the lock made read-modify-write exclusive
    print("racers:", reports)
