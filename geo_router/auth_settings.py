"""The router's ``auth:`` block: API keys and their tenants, limits and cache scopes.

A key is configured by its sha256 digest (:func:`hash_key`), never the key
itself; ``auth.limits`` says where the rate-limit buckets live
(:mod:`geo_router.limits`).
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field, SecretStr, field_validator

from geo_router.limits import LimitsSettings
from servekit.config import Section
from servekit.secrets import SecretSettings
from servekit.service_auth import check_sha256_hex
from servekit.service_auth import hash_token as hash_key

__all__ = ["ApiKeySettings", "AuthSettings", "hash_key"]


class ApiKeySettings(Section):
    sha256: str = Field(description="Hex sha256 of the key; the key itself is never stored.")
    tenant: str = Field(min_length=1)
    priority: Literal["interactive", "batch"] = "interactive"
    rpm: int | None = Field(None, ge=1, description="Requests per minute; unlimited if unset.")
    tpm: int | None = Field(None, ge=1, description="Tokens (prompt + max output) per minute.")
    burst_s: float = Field(
        60.0, gt=0, le=60, description="Seconds of the rate that may be spent at once."
    )
    max_streams: int | None = Field(
        None,
        ge=1,
        description="Requests in flight at once (per router); more answer 429 at once. A "
        "stream a client reads slowly holds an engine slot until it ends.",
    )
    stream_deadline_s: float | None = Field(
        None,
        gt=0,
        description="This key's answers end this long after their request arrived (a "
        "stream with an error event and [DONE]); unset: server.stream_deadline_s.",
    )
    operator: bool = Field(
        False,
        description="May see routing internals: /v1/route/explain and X-Route-Cached-Tokens. "
        "What an instance holds cached tells whether somebody (another tenant) sent a text "
        "recently, so tenants' keys do not.",
    )
    cache_scope: str | None = Field(
        None,
        min_length=1,
        max_length=256,
        description="Whose prefix caches this key's requests share. Unset: its tenant's "
        "own (every key of the tenant, no one else). A name: every key naming the same "
        "scope (e.g. `shared`, or a group of tenants with one long system prompt) shares "
        "one cache, so its prompts prefill once for all of them, and each of them can tell "
        "from cached_tokens and time to first token what the others recently sent.",
    )

    @field_validator("sha256")
    @classmethod
    def _hex(cls, value: str) -> str:
        return check_sha256_hex(value)


class AuthSettings(SecretSettings):
    secret_fields = ("cache_salt_key",)
    required: bool = Field(True, description="Reject requests without a configured key.")
    keys: list[ApiKeySettings] = Field(default_factory=list)
    cache_salt_key: SecretStr | None = Field(
        None,
        description="Key of the HMAC that turns a cache scope into the cache_salt sent "
        "upstream (better: cache_salt_key_file or cache_salt_key_env); the same on every "
        "router, or their tenants' caches split. Unset: a fixed key, so anyone who can "
        "call an engine directly could compute a tenant's salt (clients of the router "
        "cannot set cache_salt either way).",
    )
    anonymous_priority: Literal["interactive", "batch"] = "interactive"
    limits: LimitsSettings = Field(
        default_factory=LimitsSettings,
        description="Where rate-limit buckets live (per router, or Redis shared by all).",
    )
