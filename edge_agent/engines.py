"""Building the edge agent's engine from its settings."""

from __future__ import annotations

from servekit.engine.llama import LlamaCppEngine, LlamaSettings
from servekit.engine.protocol import Engine

__all__ = ["build_engine"]


def build_engine(settings: LlamaSettings, version: str) -> Engine:
    plain = LlamaSettings.model_validate(settings.model_dump(exclude={"kind"}))
    return LlamaCppEngine(plain, version=version)
