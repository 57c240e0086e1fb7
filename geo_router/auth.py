"""API keys, tenants and per-key rate limits (requests and tokens per minute).

Keys are stored as sha256 digests; a presented key is hashed and compared
against every configured digest in constant time (``servekit.service_auth``'s
:class:`~servekit.service_auth.DigestSet`, which the services' own tokens use
too). An accepted header is remembered until the keys change (SIGHUP reloads
them: :meth:`Authenticator.update`), so a returning client skips the hashing;
a rejected one is checked in full every time.

Each tenant carries the ``cache_salt`` its requests are sent upstream with
(:func:`cache_salt`): engines reuse cached prompt prefixes only within one
salt (vLLM's ``cache_salt``; this project's llama.cpp engines alike), and the
router's prefix index names prefixes per salt. The salt is an HMAC of the
key's cache scope (its tenant, or a scope several keys name on purpose), so
it says nothing of the tenant's name to an engine's logs, and with
``auth.cache_salt_key`` set nobody without that key can compute it. Clients
never choose it: the router refuses a client's ``cache_salt``
(``servekit.wire.unknown_fields``).
"""

from __future__ import annotations

import contextlib
import hashlib
import hmac
import math
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Literal

from geo_router.auth_settings import ApiKeySettings, AuthSettings
from geo_router.limits import Buckets, LocalBuckets
from servekit.errors import AuthenticationFailed, RateLimited
from servekit.service_auth import DigestSet, bearer_token

__all__ = ["Authenticator", "RateLimiter", "Tenant", "cache_salt"]


@dataclass(frozen=True, slots=True)
class Tenant:
    name: str
    priority: Literal["interactive", "batch"]
    key_id: str  # first digest characters: a stable, non-secret handle for limits and logs
    rpm: int | None = None
    tpm: int | None = None
    burst_s: float = 60.0
    operator: bool = False  # may see routing internals (explain, cached-token figures)
    max_streams: int | None = None  # requests in flight at once, per router
    cache_salt: str | None = None  # its cache scope, as engines take it (see cache_salt)
    stream_deadline_s: float | None = None  # its own answers' deadline (None: the server's)


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
        secret = settings.cache_salt_key
        key = _DEFAULT_SALT_KEY if secret is None else secret.get_secret_value().encode()
        anonymous = cache_salt(key, "anonymous")
        self._keys = _Keys(
            settings.required,
            Tenant("anonymous", settings.anonymous_priority, "anonymous", cache_salt=anonymous),
            DigestSet(k.sha256 for k in settings.keys),
            [_tenant(k, key) for k in settings.keys],
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


# Without auth.cache_salt_key: salts still differ per scope and clients still cannot
# set one; only a party that can call an engine directly could compute them.
_DEFAULT_SALT_KEY = b"hybrid-llm cache scope"


def cache_salt(key: bytes, scope: str) -> str:
    """The ``cache_salt`` of a cache scope: 64 hex digits of HMAC-SHA256 under ``key``
    (vLLM takes up to 128 characters, none of ``@ / \\`` or NUL)."""
    return hmac.new(key, scope.encode("utf-8"), hashlib.sha256).hexdigest()


def _tenant(entry: ApiKeySettings, salt_key: bytes) -> Tenant:
    # Named scopes and tenants' own scopes never meet, whatever the names.
    scope = f"scope:{entry.cache_scope}" if entry.cache_scope else f"tenant:{entry.tenant}"
    return Tenant(
        entry.tenant,
        entry.priority,
        entry.sha256[:12],
        entry.rpm,
        entry.tpm,
        entry.burst_s,
        entry.operator,
        entry.max_streams,
        cache_salt(salt_key, scope),
        entry.stream_deadline_s,
    )


class RateLimiter:
    """Per-key request and token buckets; raises :class:`RateLimited` with Retry-After.

    The buckets live where ``auth.limits`` says (``geo_router.limits``): this
    process, or Redis shared by every router.
    """

    def __init__(self, buckets: Buckets | None = None) -> None:
        self._buckets = buckets if buckets is not None else LocalBuckets()
        self._open: dict[str, int] = {}  # requests in flight per key (max_streams)

    @contextlib.contextmanager
    def in_flight(self, tenant: Tenant) -> Iterator[None]:
        """Holds one of ``tenant``'s ``max_streams`` while its request is served (this
        router's count: a slow reader keeps its stream, and the engine slot, open)."""
        cap = tenant.max_streams
        if cap is None:
            yield
            return
        key = tenant.key_id
        held = self._open.get(key, 0)
        if held >= cap:
            raise RateLimited(
                f"tenant {tenant.name!r} has {cap} requests in flight, its max_streams",
                code="concurrency_limit_exceeded",
                retry_after=1,
            )
        self._open[key] = held + 1
        try:
            yield
        finally:
            left = self._open[key] - 1
            if left:
                self._open[key] = left
            else:
                del self._open[key]

    async def check(self, tenant: Tenant, tokens: int, now: float | None = None) -> None:
        now = time.monotonic() if now is None else now
        if tenant.rpm is not None:
            wait = await self._buckets.take(
                "rpm:" + tenant.key_id, tenant.rpm, tenant.burst_s, 1, now
            )
            if wait > 0:
                raise RateLimited(
                    f"rate limit of {tenant.rpm} requests per minute reached for "
                    f"tenant {tenant.name!r}",
                    retry_after=math.ceil(wait),
                )
        if tenant.tpm is not None:
            wait = await self._buckets.take(
                "tpm:" + tenant.key_id, tenant.tpm, tenant.burst_s, tokens, now
            )
            if wait > 0:
                if tenant.rpm is not None:
                    await self._buckets.give_back(
                        "rpm:" + tenant.key_id, tenant.rpm, tenant.burst_s, 1
                    )
                raise RateLimited(
                    f"rate limit of {tenant.tpm} tokens per minute reached for "
                    f"tenant {tenant.name!r}",
                    code="tokens_rate_limit_exceeded",
                    retry_after=math.ceil(wait),
                )

    async def settle(self, tenant: Tenant, charged: int, usage: object) -> int:
        """After the answer: settle ``charged`` (taken at intake: the prompt's estimate plus
        the capped completion budget) to the tokens its ``usage`` reports. What the answer
        did not use goes back (most end before the cap); what the usage shows beyond the
        charge (a prompt the estimator under-counted) is taken too, even from an empty
        bucket, so the tenant's next requests wait for it. Nothing without a usage to
        trust. Returns the tokens given back (negative: taken)."""
        if tenant.tpm is None or charged <= 0 or not isinstance(usage, dict):
            return 0
        used = usage.get("total_tokens")
        if not isinstance(used, int) or isinstance(used, bool) or used < 0:
            return 0
        owed = charged - used
        if owed:
            await self._buckets.give_back("tpm:" + tenant.key_id, tenant.tpm, tenant.burst_s, owed)
        return owed

    async def aclose(self) -> None:
        await self._buckets.aclose()
