"""The central gateway's settings tree, loaded once from YAML."""

from __future__ import annotations

import socket
from pathlib import Path
from typing import Any

from pydantic import Field, model_validator

import servekit.settings
from central.specs import ReplicaSpec
from servekit.config import Section, load_settings
from servekit.engine.process import ProcessSettings
from servekit.peers import PeerSettings
from servekit.registry import RegistrySettings
from servekit.settings import ServiceServerSettings
from servekit.tracing import EngineTraces, TracingSettings, instance_resource

__all__ = [
    "AdmissionSettings",
    "BalancingSettings",
    "CentralSettings",
    "InstanceSettings",
    "ServerSettings",
    "SupervisionSettings",
    "load",
]


class ServerSettings(ServiceServerSettings):
    port: int = Field(8100, ge=0, le=65535, description="Port to listen on.")


class BalancingSettings(Section):
    """Least-loaded choice with prefix affinity by bounded-load consistent hashing."""

    prefix_affinity: bool = Field(
        True, description="Send requests sharing a prompt prefix to the same replica."
    )
    prefix_chars: int = Field(
        1024, ge=16, description="How much of the prompt prefix is hashed (characters)."
    )
    load_bound: float = Field(
        0.25,
        gt=0.0,
        description="ε: a prefix's home replica is skipped above (1+ε)× its fair share of load.",
    )
    virtual_nodes: int = Field(64, ge=1, description="Points per replica on the hash ring.")
    kv_cache_weight: float = Field(
        1.0, ge=0.0, description="How much KV-cache fullness counts, in sequences per capacity."
    )
    shed_backoff_s: float = Field(
        0.5,
        ge=0.0,
        description="After a replica refused a request (429) without a Retry-After, how "
        "long it ranks behind the others.",
    )


class SupervisionSettings(ProcessSettings):
    """The shared process settings (start deadline, restart backoff, stop grace) plus probing."""

    health_interval_s: float = Field(1.0, gt=0.0)
    scrape_interval_s: float = Field(0.5, gt=0.0)
    probe_timeout_s: float = Field(2.0, gt=0.0)
    unhealthy_after: int = Field(
        2, ge=1, description="Consecutive failed probes before a replica leaves the rotation."
    )
    dispatch_wait_s: float = Field(
        5.0, ge=0.0, description="How long a request waits for some replica to be healthy."
    )
    log_dir: Path = Field(Path("logs/central"), description="Replica logs and generated files.")


class AdmissionSettings(servekit.settings.AdmissionSettings):
    """The gateway's own queue in front of all replicas (interactive before batch)."""

    max_waiting: int = Field(512, ge=0, description="Requests that may wait; more get 429.")


class InstanceSettings(servekit.settings.InstanceSettings):
    """Who this gateway is in the fleet registry."""

    id: str = Field(
        default_factory=lambda: f"central-{socket.gethostname()}",
        description="Unique instance id.",
    )
    region: str = Field("center", min_length=1, description="Region label (metrics, registry).")


class CentralSettings(Section):
    model: str = Field(description="The model name clients address the center by.")
    version: str = ""
    server: ServerSettings = Field(default_factory=ServerSettings)
    replicas: list[ReplicaSpec] = Field(min_length=1)
    balancing: BalancingSettings = Field(default_factory=BalancingSettings)
    supervision: SupervisionSettings = Field(default_factory=SupervisionSettings)
    admission: AdmissionSettings = Field(default_factory=AdmissionSettings)
    instance: InstanceSettings = Field(default_factory=InstanceSettings)
    tracing: TracingSettings = Field(
        default_factory=TracingSettings, description="OpenTelemetry traces (off by default)."
    )
    registry: RegistrySettings | None = Field(
        None, description="Register as tier `center` and heartbeat here; none means standalone."
    )
    replica_client: PeerSettings = Field(
        default_factory=PeerSettings,
        description="How the gateway calls its replicas: token, CA bundle, client certificate. "
        "Launched replicas are given the token (VLLM_API_KEY, the stand-in's server.auth).",
    )

    @property
    def open_because(self) -> str | None:
        """Why anyone may call the gateway (None: a service token is required)."""
        return self.server.open_because

    def engine_traces(self) -> EngineTraces | None:
        """Where launched vLLM replicas send their spans: the gateway's collector."""
        resource = instance_resource("center", self.instance, self.model)
        return self.tracing.for_engine("vllm", resource)

    @model_validator(mode="after")
    def _replicas_disjoint(self) -> CentralSettings:
        names = [r.name for r in self.replicas]
        dupes = sorted({n for n in names if names.count(n) > 1})
        if dupes:
            raise ValueError(f"replica names must be unique: {dupes}")
        owner: dict[tuple[str, int], str] = {}
        for r in self.replicas:
            for gpu in getattr(r, "gpus", []):
                key = (r.host, gpu)
                if key in owner:
                    raise ValueError(
                        f"GPU {gpu} on {r.host} is given to both {owner[key]} and {r.name}"
                    )
                owner[key] = r.name
        ports = [(r.host, r.port) for r in self.replicas if r.kind != "url" and r.port]
        if len(set(ports)) != len(ports):
            raise ValueError("two launched replicas share a host:port")
        return self


def load(path: str | Path | None, **overrides: Any) -> CentralSettings:
    """Read a central config file (ConfigError names the file and field)."""
    return load_settings(CentralSettings, path, **overrides)
