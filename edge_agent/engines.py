"""Building the edge agent's engine, and its extra metrics, from its settings."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import cast

from prometheus_client.registry import Collector

from edge_agent.settings import BatchingEngineSettings, EdgeEngineSettings, VllmEdgeEngineSettings
from servekit.engine.batching import BatchingLlamaEngine, BatchingSettings
from servekit.engine.batching_metrics import BatchingCollector
from servekit.engine.llama import LlamaCppEngine, LlamaSettings
from servekit.engine.protocol import Engine
from servekit.engine.vllm import VllmEngine, VllmEngineSettings

__all__ = ["build_engine", "engine_collectors"]


def build_engine(settings: EdgeEngineSettings, version: str) -> Engine:
    plain = settings.model_dump(exclude={"kind", "swap"})
    if isinstance(settings, VllmEdgeEngineSettings):
        return VllmEngine(VllmEngineSettings.model_validate(plain), version=version)
    if isinstance(settings, BatchingEngineSettings):
        return BatchingLlamaEngine(BatchingSettings.model_validate(plain), version=version)
    return LlamaCppEngine(LlamaSettings.model_validate(plain), version=version)


def engine_collectors(
    settings: EdgeEngineSettings,
    current: Callable[[], Engine],
    labels: Mapping[str, str],
) -> list[Collector]:
    """Scheduler metrics for engines that have them; ``current`` follows hot swaps."""
    if isinstance(settings, BatchingEngineSettings):
        return [BatchingCollector(lambda: cast(BatchingLlamaEngine, current()).stats(), labels)]
    return []
