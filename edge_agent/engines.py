"""Building the edge agent's engine, and its extra metrics, from its settings.

:data:`EngineFactory` is the agent's engine seam: the app builds every engine
it serves (the first one and each hot-swapped version) through one, by
default :func:`engine_factory` (:func:`build_engine` with the agent's
tracing: a vLLM engine exports its spans where the agent does); tests pass
one that builds a scripted engine.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from functools import partial
from typing import TYPE_CHECKING, cast

from prometheus_client.registry import Collector

from edge_agent.settings import (
    BatchingEngineSettings,
    EdgeEngineSettings,
    EdgeSettings,
    VllmEdgeEngineSettings,
)
from servekit.engine.batching_metrics import BatchingCollector
from servekit.engine.batching_settings import BatchingSettings
from servekit.engine.llama import LlamaCppEngine, LlamaSettings
from servekit.engine.protocol import Engine
from servekit.engine.vllm import VllmEngine, VllmEngineSettings
from servekit.tracing import EngineTraces, instance_resource

if TYPE_CHECKING:
    from servekit.engine.batching import BatchingLlamaEngine

__all__ = ["EngineFactory", "build_engine", "engine_collectors", "engine_factory"]

EngineFactory = Callable[[EdgeEngineSettings, str], Engine]
"""Builds the engine for these engine settings, labelled with a model version."""


def build_engine(
    settings: EdgeEngineSettings, version: str, *, traces: EngineTraces | None = None
) -> Engine:
    """The real engine the settings name: llama.cpp in process, batching, or vLLM
    (exporting its own spans with ``traces``)."""
    plain = settings.model_dump(exclude={"kind", "swap"})
    if isinstance(settings, VllmEdgeEngineSettings):
        engine = VllmEngineSettings.model_validate(plain)
        return VllmEngine(engine, version=version, traces=traces)
    if isinstance(settings, BatchingEngineSettings):
        # Imported here: it loads llama.cpp, which a vLLM edge never needs.
        from servekit.engine.batching import BatchingLlamaEngine

        return BatchingLlamaEngine(BatchingSettings.model_validate(plain), version=version)
    return LlamaCppEngine(LlamaSettings.model_validate(plain), version=version)


def engine_factory(settings: EdgeSettings) -> EngineFactory:
    """:func:`build_engine` for this agent: an engine process traces into its collector."""
    resource = instance_resource("edge", settings.instance, settings.engine.model_name)
    return partial(build_engine, traces=settings.tracing.for_engine("vllm", resource))


def engine_collectors(
    settings: EdgeEngineSettings,
    current: Callable[[], Engine],
    labels: Mapping[str, str],
) -> list[Collector]:
    """Scheduler metrics for engines that have them; ``current`` follows hot swaps."""
    if isinstance(settings, BatchingEngineSettings):
        return [BatchingCollector(lambda: cast("BatchingLlamaEngine", current()).stats(), labels)]
    return []
