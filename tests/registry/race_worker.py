"""One racer for the multi-process test: ``python -m tests.registry.race_worker DB N GO``.

Waits for the file ``GO`` (so racers start together), then does ``N``
compare-and-swap increments of ``race/cas`` and ``N`` lock-protected
read-modify-write increments of ``race/locked`` (plain put under the lock),
and prints how many CAS attempts lost and how often the lock was busy.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
import time
from pathlib import Path

from servekit.registry.embedded import EmbeddedRegistry


async def race(db: Path, n: int) -> dict[str, int]:
    registry = EmbeddedRegistry(db, busy_timeout_s=10.0, poll_interval_s=0.01)
    cas_conflicts = lock_busy = 0
    try:
        for _ in range(n):
            while True:
                entry = await registry.get("race/cas")
                value = int(entry.value) if entry else 0
                if await registry.put_if(
                    "race/cas", str(value + 1).encode(), entry.modify_index if entry else 0
                ):
                    break
                cas_conflicts += 1
        for _ in range(n):
            while (lock := await registry.acquire_lock("race/lock", str(os.getpid()), 5)) is None:
                lock_busy += 1
                await asyncio.sleep(0.001)
            entry = await registry.get("race/locked")
            await asyncio.sleep(0)  # give the other racer a chance to interleave
            await registry.put("race/locked", str(int(entry.value) + 1 if entry else 1).encode())
            await registry.release_lock(lock)
    finally:
        await registry.aclose()
    return {"cas_conflicts": cas_conflicts, "lock_busy": lock_busy}


def main() -> None:
    db, n, go = Path(sys.argv[1]), int(sys.argv[2]), Path(sys.argv[3])
    deadline = time.monotonic() + 30
    while not go.exists():
        if time.monotonic() > deadline:
            raise SystemExit("never told to go")
        time.sleep(0.005)
    print(json.dumps(asyncio.run(race(db, n))))


if __name__ == "__main__":
    main()
