"""API keys, tenants and per-key rate limits (requests and tokens per minute).

Keys are stored as sha256 digests; a presented key is hashed and compared
against every configured digest in constant time (``servekit.service_auth``'s
:class:`~servekit.service_auth.DigestSet`, which the services' own tokens use
too). An accepted header is remembered until the keys change (SIGHUP reloads
them: :meth:`Authenticator.update`), so a returning client skips the hashing;
a rejected one is checked in full every time.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from typing import Literal

from geo_router.settings import ApiKeySettings, AuthSettings
from servekit.errors import AuthenticationFailed, RateLimited
from servekit.service_auth import DigestSet, bearer_token

__all__ = ["Authenticator", "RateLimiter", "Tenant", "TokenBucket"]


@dataclass(frozen=True, slots=True)
class Tenant:
    name: str
    priority: Literal["interactive", "batch"]
    key_id: str  # first digest characters: a stable, non-secret handle for limits and logs
    rpm: int | None = None
    tpm: int | None = None
    burst_s: float = 60.0


@dataclass(frozen=True, slots=True)
class _Keys:
    required: bool
    anonymous: Tenant
    digests: DigestSet
    tenants: list[Tenant]


class Authenticator:
    """Maps an ``Authorization: Bearer`` header to a :class:`Tenant`."""

    def __init__(self, settings: AuthSettings) -> None:
        self.update(settings)

    def update(self, settings: AuthSettings) -> None:
        """Accept these keys from now on (SIGHUP); one swap, so no request sees a mix."""
        self._keys = _Keys(
            settings.required,
            Tenant("anonymous", settings.anonymous_priority, "anonymous"),
            DigestSet(k.sha256 for k in settings.keys),
            [_tenant(k) for k in settings.keys],
        )

    def authenticate(self, authorization: str | None) -> Tenant:
        keys = self._keys
        index = keys.digests.match_header(authorization)
        if index is not None:
            return keys.tenants[index]
        if bearer_token(authorization) is None:
            if not keys.required:
                return keys.anonymous
            raise AuthenticationFailed(
                "missing API key: send 'Authorization: Bearer <key>'", code="missing_api_key"
            )
        raise AuthenticationFailed("invalid API key")


def _tenant(entry: ApiKeySettings) -> Tenant:
    return Tenant(
        entry.tenant, entry.priority, entry.sha256[:12], entry.rpm, entry.tpm, entry.burst_s
    )


class TokenBucket:
    """``rate_per_min`` units per minute, bursting up to ``burst_s`` seconds' worth."""

    def __init__(self, rate_per_min: float, now: float, burst_s: float = 60.0) -> None:
        self.rate = rate_per_min / 60.0
        self.capacity = max(1.0, self.rate * burst_s)
        self.level = self.capacity
        self.stamp = now

    def take(self, amount: float, now: float) -> float:
        """Take ``amount``; 0.0 on success, else seconds until it would fit."""
        self.level = min(self.capacity, self.level + (now - self.stamp) * self.rate)
        self.stamp = now
        amount = min(amount, self.capacity)  # an oversized request waits for a full bucket
        if self.level >= amount:
            self.level -= amount
            return 0.0
        return (amount - self.level) / self.rate

    def give_back(self, amount: float) -> None:
        self.level = min(self.capacity, self.level + amount)


class RateLimiter:
    """Per-key request and token buckets; raises :class:`RateLimited` with Retry-After."""

    def __init__(self) -> None:
        self._rpm: dict[str, TokenBucket] = {}
        self._tpm: dict[str, TokenBucket] = {}

    def check(self, tenant: Tenant, tokens: int, now: float | None = None) -> None:
        now = time.monotonic() if now is None else now
        req_bucket = tok_bucket = None
        if tenant.rpm is not None:
            req_bucket = self._rpm.get(tenant.key_id)
            if req_bucket is None:
                req_bucket = self._rpm[tenant.key_id] = TokenBucket(tenant.rpm, now, tenant.burst_s)
            wait = req_bucket.take(1, now)
            if wait > 0:
                raise RateLimited(
                    f"rate limit of {tenant.rpm} requests per minute reached for "
                    f"tenant {tenant.name!r}",
                    retry_after=math.ceil(wait),
                )
        if tenant.tpm is not None:
            tok_bucket = self._tpm.get(tenant.key_id)
            if tok_bucket is None:
                tok_bucket = self._tpm[tenant.key_id] = TokenBucket(tenant.tpm, now, tenant.burst_s)
            wait = tok_bucket.take(tokens, now)
            if wait > 0:
                if req_bucket is not None:
                    req_bucket.give_back(1)
                raise RateLimited(
                    f"rate limit of {tenant.tpm} tokens per minute reached for "
                    f"tenant {tenant.name!r}",
                    code="tokens_rate_limit_exceeded",
                    retry_after=math.ceil(wait),
                )
