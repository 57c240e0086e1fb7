from __future__ import annotations

from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
MODEL = REPO / "models" / "SmolLM2-135M-Instruct.Q4_1.gguf"


@pytest.fixture(scope="session")
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture(scope="session")
def model_path() -> Path:
    """The real GGUF model; `scripts/setup.sh` (or `hybrid-llm fetch-models`) puts it there."""
    if not MODEL.is_file():
        pytest.fail(f"{MODEL} missing: run `.venv/bin/hybrid-llm fetch-models`")
    return MODEL
