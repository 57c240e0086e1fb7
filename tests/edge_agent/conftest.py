from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from edge_agent.settings import EdgeSettings


@pytest.fixture
def edge_settings(model_path: Path) -> Any:
    """Build EdgeSettings for the real model with dotted overrides."""

    def make(**overrides: Any) -> EdgeSettings:
        data: dict[str, Any] = {
            "instance": {"id": "edge-test", "region": "test", "version": "v1"},
            "engine": {
                "model_path": str(model_path),
                "model_name": "smollm2-135m-instruct",
                "n_ctx": 1024,
                "n_threads": 2,
                "warmup_tokens": 2,
            },
            "admission": {"max_waiting": 4},
            "server": {"log_level": "warning"},
        }
        for key, value in overrides.items():
            node = data
            parts = key.split("__")
            for part in parts[:-1]:
                node = node.setdefault(part, {})
            node[parts[-1]] = value
        return EdgeSettings.model_validate(data)

    return make
