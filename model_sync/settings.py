"""Settings of the ``model-sync`` tool and controller, loaded from YAML.

Any service's YAML works as the file: only its ``registry:`` block (and
``model_sync:``-specific blocks when present) is read, so an operator can
point the CLI at the same file the services use::

    registry: {backend: embedded, embedded: {path: var/registry.db}}
    artifacts: {token_file: /etc/hybrid-llm/artifact-token}   # push from a protected URL
    signing: {key_file: $CREDENTIALS_DIRECTORY/operator.key}  # `push` and `sign` use it
    artifact_server:              # model-sync serve-artifacts
      auth: {tokens_file: /etc/hybrid-llm/artifact-tokens}
      tls: {cert_file: artifacts.pem, key_file: artifacts-key.pem}
    controller:
      tick_s: 1
      prometheus:                 # optional: gate figures from Prometheus
        url: http://127.0.0.1:9090
        client: {token_file: /etc/hybrid-llm/prometheus-token, ca_file: ca.pem}
"""

from __future__ import annotations

from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field, SecretStr

from model_sync.signing import SigningKey
from servekit.config import Section, load_settings
from servekit.peers import PeerSettings
from servekit.registry import RegistrySettings
from servekit.secrets import SecretSettings
from servekit.settings import ServerSecurity

__all__ = [
    "ControllerSettings",
    "ModelSyncSettings",
    "PrometheusSettings",
    "SigningSettings",
    "load",
]

ERROR_RATE_QUERY = (
    'sum(rate(hybrid_requests_total{model="$model",version="$version",outcome="error"}[$window]))'
    ' / sum(rate(hybrid_requests_total{model="$model",version="$version"}[$window]))'
)
TTFT_P95_QUERY = (
    "1000 * histogram_quantile(0.95, sum by (le) (rate("
    'vllm:time_to_first_token_seconds_bucket{model="$model",version="$version"}[$window])))'
)


class PrometheusSettings(Section):
    url: str = Field(description="Prometheus base URL, e.g. http://127.0.0.1:9090.")
    error_rate_query: str = Field(
        ERROR_RATE_QUERY, description="PromQL; $model, $version, $window are substituted."
    )
    ttft_p95_query: str = Field(TTFT_P95_QUERY, description="PromQL returning milliseconds.")
    timeout_s: float = Field(10.0, gt=0)
    client: PeerSettings = Field(
        default_factory=PeerSettings, description="Token and TLS trust for Prometheus."
    )


class ControllerSettings(Section):
    tick_s: float = Field(1.0, gt=0, description="How often the controller looks at rollouts.")
    lock_ttl_s: float = Field(15.0, gt=0, description="Lease of the single-controller lock.")
    prometheus: PrometheusSettings | None = None


class SigningSettings(SecretSettings):
    """The operator's signing key (``model-sync keygen``): ``key_file`` or ``key_env``."""

    secret_fields = ("key",)
    key: SecretStr | None = Field(
        None, description="PEM ed25519 private key (better: key_file or key_env)."
    )

    def signing_key(self) -> SigningKey | None:
        if self.key is None:
            return None
        return SigningKey.from_pem(self.key.get_secret_value())


class ModelSyncSettings(BaseModel):
    # Other services' blocks may sit beside these in a shared file.
    model_config = ConfigDict(extra="ignore")

    registry: RegistrySettings = Field(default_factory=RegistrySettings)
    controller: ControllerSettings = Field(default_factory=ControllerSettings)
    artifacts: PeerSettings = Field(
        default_factory=PeerSettings,
        description="Token and TLS trust for reading artifact URLs (`push`).",
    )
    artifact_server: ServerSecurity = Field(
        default_factory=ServerSecurity,
        description="Tokens and certificate of `serve-artifacts`.",
    )
    signing: SigningSettings = Field(
        default_factory=SigningSettings,
        description="The key `push` and `sign` sign version records with.",
    )


def load(
    path: Path | None, registry_db: Path | None = None, **overrides: object
) -> ModelSyncSettings:
    """Settings from ``path`` (or defaults); ``registry_db`` selects an embedded store file."""
    if registry_db is not None:
        overrides |= {"registry.backend": "embedded", "registry.embedded.path": str(registry_db)}
    return load_settings(ModelSyncSettings, path, **overrides)
