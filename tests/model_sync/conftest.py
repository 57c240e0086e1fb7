from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from servekit.registry import Registry, RegistrySettings, open_registry


@pytest.fixture
async def registry(tmp_path: Path) -> AsyncIterator[Registry]:
    """The real embedded registry (SQLite in WAL mode) in a fresh file."""
    settings = RegistrySettings.model_validate(
        {"backend": "embedded", "embedded": {"path": str(tmp_path / "registry.db")}}
    )
    reg = await open_registry(settings)
    try:
        yield reg
    finally:
        await reg.aclose()
