"""Registry settings: which backend, and how to reach it.

One ``registry:`` block in each service's YAML::

    registry:
      backend: embedded            # embedded | consul | static
      embedded: {path: var/registry.db}
      consul: {address: 127.0.0.1:8500, service_name: hybrid-llm}
      static:
        entries:
          - {url: "http://127.0.0.1:8101", tier: edge, region: eu-west, model: smollm2}
      ttl_s: 10
      heartbeat_interval_s: 3

Consul connection fields left unset fall back to the standard environment
variables (``CONSUL_HTTP_ADDR``, ``CONSUL_HTTP_TOKEN``, ``CONSUL_HTTP_TOKEN_FILE``,
``CONSUL_HTTP_SSL``, ``CONSUL_HTTP_SSL_VERIFY``, ``CONSUL_CACERT``,
``CONSUL_CLIENT_CERT``, ``CONSUL_CLIENT_KEY``); values in the file win over the
environment. The ACL token may also come from ``token_file`` (e.g.
``$CREDENTIALS_DIRECTORY/consul-token``) or ``token_env``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, SecretStr, model_validator

from servekit.registry.protocol import Tier
from servekit.secrets import SecretSettings

__all__ = [
    "ConsulSettings",
    "EmbeddedSettings",
    "RegistrySettings",
    "StaticEntry",
    "StaticSettings",
]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class EmbeddedSettings(_Strict):
    path: Path = Field(
        Path("var/registry.db"), description="SQLite file shared by every process on the machine."
    )
    deregister_after_s: float = Field(
        60.0, gt=0, description="How long an expired instance stays listed as unhealthy."
    )
    poll_interval_s: float = Field(
        0.05, gt=0, le=1.0, description="How often a watch polls the change index."
    )
    busy_timeout_s: float = Field(
        5.0, gt=0, description="How long a write waits for another process's transaction."
    )


class ConsulSettings(SecretSettings):
    secret_fields = ("token",)
    address: str | None = Field(
        None, description="host:port or scheme://host:port; default $CONSUL_HTTP_ADDR."
    )
    token: SecretStr | None = Field(
        None,
        description="ACL token (or token_file / token_env); default $CONSUL_HTTP_TOKEN, "
        "then $CONSUL_HTTP_TOKEN_FILE.",
    )
    scheme: Literal["http", "https"] | None = Field(
        None, description="Default from the address, then $CONSUL_HTTP_SSL."
    )
    verify: bool | None = Field(
        None, description="Verify the server certificate; default $CONSUL_HTTP_SSL_VERIFY."
    )
    ca_cert: Path | None = Field(None, description="CA bundle; default $CONSUL_CACERT.")
    client_cert: Path | None = Field(None, description="mTLS cert; default $CONSUL_CLIENT_CERT.")
    client_key: Path | None = Field(None, description="mTLS key; default $CONSUL_CLIENT_KEY.")
    datacenter: str | None = Field(None, description="Datacenter; default the agent's.")
    service_name: str = Field(
        "hybrid-llm", min_length=1, description="Consul service all instances register under."
    )
    deregister_critical_after_s: float = Field(
        60.0, gt=0, description="DeregisterCriticalServiceAfter (Consul enforces at least 1m)."
    )
    request_timeout_s: float = Field(
        10.0, gt=0, description="Per request; blocking queries add their wait."
    )
    min_watch_interval_s: float = Field(
        0.1, ge=0, description="Rate limit between blocking queries when data churns."
    )


class StaticEntry(_Strict):
    url: str = Field(description="Base URL of the instance, e.g. http://10.0.0.5:8101.")
    tier: Tier
    region: str
    model: str
    id: str | None = Field(None, description="Defaults to the URL.")
    version: str = ""
    capacity: int = Field(1, ge=1)
    tags: list[str] = Field(default_factory=list)


class StaticSettings(_Strict):
    entries: list[StaticEntry] = Field(default_factory=list)
    probe_interval_s: float = Field(2.0, gt=0, description="How often /ready is polled.")
    probe_timeout_s: float = Field(1.0, gt=0)
    unreachable_after: int = Field(
        2,
        ge=1,
        description="Probes in a row without an answer before an entry counts as down (a"
        " 503 from /ready counts at once): one probe timing out on a busy host is not an outage.",
    )
    load_path: str | None = Field(
        "/load", description="JSON LoadReport endpoint polled with /ready; null to skip."
    )


class RegistrySettings(_Strict):
    """The ``registry:`` block every service shares."""

    backend: Literal["embedded", "consul", "static"] = "embedded"
    embedded: EmbeddedSettings = Field(default_factory=EmbeddedSettings)
    consul: ConsulSettings = Field(default_factory=ConsulSettings)
    static: StaticSettings = Field(default_factory=StaticSettings)
    ttl_s: float = Field(10.0, gt=0, description="An instance expires this long after a beat.")
    heartbeat_interval_s: float = Field(3.0, gt=0, description="How often instances beat.")

    @model_validator(mode="after")
    def _beats_fit_in_ttl(self) -> RegistrySettings:
        if self.heartbeat_interval_s >= self.ttl_s:
            raise ValueError(
                f"heartbeat_interval_s ({self.heartbeat_interval_s}) must be below ttl_s"
                f" ({self.ttl_s}), or instances flap"
            )
        return self
