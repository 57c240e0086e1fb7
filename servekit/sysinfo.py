"""Small facts about the host that serving decisions depend on."""

from __future__ import annotations

from pathlib import Path

__all__ = ["fits_beside", "mem_available_bytes"]


def mem_available_bytes() -> int | None:
    """Linux's estimate of memory available without swapping, or None if unknown."""
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        return None
    return None


def fits_beside(
    model_path: Path,
    *,
    overhead: float = 1.3,
    reserve_bytes: int = 256 << 20,
    runtime_bytes: int = 0,
) -> bool:
    """Whether a second model of this size (a file, or a model directory's files)
    fits in memory next to the first, with ``runtime_bytes`` for its engine process."""
    available = mem_available_bytes()
    if available is None:
        return True
    need = int(_size(model_path) * overhead) + reserve_bytes + runtime_bytes
    return available >= need


def _size(path: Path) -> int:
    if path.is_dir():
        return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())
    return path.stat().st_size
