"""The JSON documents model_sync keeps in the registry KV, as pydantic models.

Each model maps one key family of :mod:`model_sync.keys`. Values are stored
as compact JSON; unknown fields are ignored on read so newer writers do not
break older readers. Nothing here holds a credential: an artifact URI loses
its ``user:password@`` and secret query parameters, history details and
node errors have them hidden (:mod:`servekit.secrets`).
"""

from __future__ import annotations

import time
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from model_sync.keys import check_name, check_node_id
from model_sync.manifest import ManifestFile, manifest_digest
from servekit.secrets import redact_text, strip_url_credentials

__all__ = [
    "ActiveRollout",
    "ActualState",
    "AliasRecord",
    "ArtifactFormat",
    "ArtifactRecord",
    "DesiredState",
    "GateSettings",
    "HistoryEntry",
    "NodeCounters",
    "NodeState",
    "RolloutPlan",
    "RolloutState",
    "RolloutStatus",
    "RolloutStep",
    "TrafficShares",
    "Wave",
]

ArtifactFormat = Literal["gguf", "hf", "awq", "fp8", "gptq"]
NodeState = Literal["serving", "downloading", "loading", "failed"]
RolloutStatus = Literal["running", "paused", "rolling_back", "completed", "aborted", "rolled_back"]
RolloutStep = Literal["apply", "converge", "bake", "gate"]


class _Doc(BaseModel):
    model_config = ConfigDict(extra="ignore")

    def dump(self) -> bytes:
        return self.model_dump_json().encode()


class ArtifactRecord(_Doc):
    """One published model version: where its file (or directory) is and what it hashes to.

    A single file (GGUF) has its own ``sha256`` and ``size``. A model directory
    (HF layout) has ``files``, its manifest; then ``uri`` names the directory
    (each file is ``uri/<path>``), ``sha256`` is the manifest's digest and
    ``size`` the sum of its files.

    ``signature`` and ``signed_by`` are the operator's ed25519 signature and
    its key's id (:mod:`model_sync.signing` says what it covers); edges that
    list trusted keys refuse a record without a valid one.
    """

    name: str
    version: str
    uri: str = Field(description="local path, file:// or http(s):// URL of the artifact")
    filename: str = Field(description="file (or directory) name inside the version's directory")
    sha256: str = Field(pattern=r"^[0-9a-f]{64}$")
    size: int = Field(ge=0)
    files: list[ManifestFile] | None = Field(
        None, description="a model directory's manifest: relative path, size, sha256 per file"
    )
    format: ArtifactFormat = "gguf"
    tier: Literal["edge", "center"] = "edge"
    notes: str = ""
    created_by: str = ""
    created_at: float = Field(default_factory=time.time)
    signature: str = Field("", description="base64 ed25519 signature (model_sync.signing)")
    signed_by: str = Field("", description="id of the key that made the signature")

    @field_validator("name")
    @classmethod
    def _name(cls, v: str) -> str:
        return check_name("model name", v)

    @field_validator("version")
    @classmethod
    def _version(cls, v: str) -> str:
        return check_name("version", v)

    @field_validator("filename")
    @classmethod
    def _filename(cls, v: str) -> str:
        return check_name("file name", v)

    @field_validator("uri")
    @classmethod
    def _no_credentials(cls, v: str) -> str:
        # The nodes authenticate with their own settings (model_sync.artifacts).
        if v.lower().startswith(("http://", "https://")):
            return strip_url_credentials(v)
        return v

    @model_validator(mode="after")
    def _manifest_matches(self) -> ArtifactRecord:
        if self.files is None:
            return self
        paths = [f.path for f in self.files]
        if not paths or len(set(paths)) != len(paths):
            raise ValueError("a model directory's manifest lists no file or one twice")
        dirs = {"/".join(p.split("/")[:i]) for p in paths for i in range(1, p.count("/") + 1)}
        if dirs & set(paths):
            raise ValueError("a manifest path is both a file and a directory")
        if manifest_digest(self.files) != self.sha256:
            raise ValueError("sha256 is not the digest of the manifest (edited file list?)")
        if sum(f.size for f in self.files) != self.size:
            raise ValueError("size is not the sum of the manifest's file sizes")
        return self

    @property
    def is_directory(self) -> bool:
        return self.files is not None


class ActiveRollout(_Doc):
    """Names the rollout in progress (or the last one); created by compare-and-swap."""

    model: str
    rollout_id: str


class AliasRecord(_Doc):
    version: str
    updated_by: str = ""
    updated_at: float = Field(default_factory=time.time)


class TrafficShares(_Doc):
    """Per-version traffic fractions for one model; the router reads this exact shape."""

    shares: dict[str, float] = Field(default_factory=dict)


class FeedbackCounts(_Doc):
    """Users' ratings of one version's answers, as one router counted them."""

    rated: int = Field(0, ge=0)
    accepted: int = Field(0, ge=0)


class DesiredState(_Doc):
    model: str
    version: str


class ActualState(_Doc):
    """What a node reports: the version it serves and what it is doing about the desired one.

    ``version`` is always the version serving requests (the old one while a
    new one downloads or after a failed load); ``target`` is the version being
    worked on.
    """

    model: str = ""
    version: str = ""
    state: NodeState = "serving"
    target: str | None = None
    progress: float = 0.0
    error: str | None = None
    ttft_p95_ms: float | None = None
    requests_ok: int = 0
    requests_failed: int = 0
    updated_at: float = Field(default_factory=time.time)

    @field_validator("error")
    @classmethod
    def _hide_secrets(cls, v: str | None) -> str | None:
        return redact_text(v) if v else v


class GateSettings(_Doc):
    """When a baked wave may go on, compared with the version it replaces."""

    max_error_rate: float = Field(
        0.05, ge=0, le=1, description="absolute ceiling for the new version"
    )
    max_error_rate_increase: float = Field(
        0.01, ge=0, le=1, description="allowed rise over the replaced version's error rate"
    )
    max_ttft_p95_ratio: float = Field(
        1.5, gt=0, description="new P95 TTFT may be at most this times the old one"
    )
    ttft_slack_ms: float = Field(
        50.0, ge=0, description="absolute slack added to the TTFT bound (small-number noise)"
    )
    min_requests: int = Field(
        20, ge=0, description="fewer requests on the new version in the bake: inconclusive"
    )
    min_feedback: int = Field(
        20,
        ge=1,
        description="ratings each version needs before the acceptance gate judges (fewer: "
        "the gate is not applied)",
    )
    max_acceptance_drop: float = Field(
        0.10,
        ge=0,
        le=1,
        description="allowed fall of users' answer-acceptance rate below the replaced version's",
    )


class Wave(_Doc):
    name: str
    nodes: list[str]
    bake_s: float = Field(60.0, ge=0)

    @field_validator("nodes")
    @classmethod
    def _nodes(cls, v: list[str]) -> list[str]:
        return [check_node_id(n) for n in v]


class RolloutPlan(_Doc):
    """What ``model-sync rollout`` asked for; written once, never changed."""

    id: str
    model: str
    version: str
    from_version: str = Field(description="the version being replaced (stable at plan time)")
    waves: list[Wave]
    previous: dict[str, str] = Field(
        default_factory=dict, description="node -> version it served before, for rollback"
    )
    gates: GateSettings = Field(default_factory=GateSettings)
    converge_timeout_s: float = 600.0
    created_by: str = ""
    created_at: float = Field(default_factory=time.time)


class NodeCounters(_Doc):
    ok: int = 0
    failed: int = 0
    ttft_p95_ms: float | None = None


class RolloutState(_Doc):
    """The controller's progress, rewritten (compare-and-swap) after every step.

    ``outbox`` holds history entries decided in the same write as the step, so
    a controller that dies right after the write flushes them on restart under
    the same keys: nothing lost, nothing repeated.
    """

    rollout_id: str
    model: str
    version: str
    status: RolloutStatus = "running"
    wave: int = 0
    step: RolloutStep = "apply"
    step_started_at: float = Field(default_factory=time.time)
    touched: list[str] = Field(default_factory=list)
    baseline: dict[str, NodeCounters] = Field(default_factory=dict)
    bake_snapshot: dict[str, NodeCounters] = Field(default_factory=dict)
    reason: str = ""
    rollback_status: Literal["rolled_back", "aborted"] = "rolled_back"
    force_pass: bool = Field(False, description="operator promote: pass the next gate")
    skip_gates: bool = Field(False, description="operator promote --full: no more gates")
    last_gate: dict[str, float | int | str | None] = Field(default_factory=dict)
    outbox: list[HistoryEntry] = Field(default_factory=list)
    updated_at: float = Field(default_factory=time.time)

    @property
    def active(self) -> bool:
        return self.status in ("running", "paused", "rolling_back")


class HistoryEntry(_Doc):
    """One action, by whom and when."""

    id: str
    at: float = Field(default_factory=time.time)
    actor: str
    action: str
    model: str = ""
    version: str = ""
    rollout_id: str = ""
    detail: str = ""
    nodes: list[str] = Field(default_factory=list)

    @field_validator("detail")
    @classmethod
    def _hide_secrets(cls, v: str) -> str:
        return redact_text(v)


RolloutState.model_rebuild()
