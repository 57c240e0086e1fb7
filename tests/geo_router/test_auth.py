from __future__ import annotations

import pytest

from geo_router.auth import Authenticator, RateLimiter, Tenant
from geo_router.auth_settings import ApiKeySettings, AuthSettings, hash_key
from servekit.errors import AuthenticationFailed, RateLimited


def _auth(required: bool = True) -> Authenticator:
    keys = [
        ApiKeySettings(sha256=hash_key("k1"), tenant="a", priority="batch", rpm=5),
        ApiKeySettings(sha256=hash_key("k2"), tenant="b"),
    ]
    return Authenticator(AuthSettings(required=required, keys=keys))


def test_known_keys_map_to_their_tenant_and_priority() -> None:
    auth = _auth()
    a = auth.authenticate("Bearer k1")
    assert (a.name, a.priority, a.rpm) == ("a", "batch", 5)
    assert auth.authenticate("bearer  k2 ").name == "b"


def test_a_remembered_key_answers_the_same_and_wrong_keys_still_fail() -> None:
    auth = _auth()
    first = auth.authenticate("Bearer k1")
    assert auth.authenticate("Bearer k1") is first
    for wrong in ("Bearer k1x", "Bearer k", "Basic k1", "k1"):
        with pytest.raises(AuthenticationFailed):
            auth.authenticate(wrong)
    assert auth.authenticate("Bearer k2").name == "b"


@pytest.mark.parametrize("header", [None, "", "Bearer", "Basic k1", "Bearer nope", "k1"])
def test_missing_or_wrong_keys_are_rejected(header: str | None) -> None:
    with pytest.raises(AuthenticationFailed) as info:
        _auth().authenticate(header)
    assert info.value.status == 401


def test_anonymous_allowed_only_when_not_required() -> None:
    assert _auth(required=False).authenticate(None).name == "anonymous"
    with pytest.raises(AuthenticationFailed):
        _auth(required=False).authenticate("Bearer wrong")


def test_settings_reject_a_key_that_is_not_a_digest() -> None:
    with pytest.raises(ValueError, match="64 hex"):
        ApiKeySettings(sha256="sk-plaintext", tenant="x")


@pytest.mark.anyio
async def test_rpm_limit_refuses_with_retry_after_then_refills() -> None:
    limiter = RateLimiter()
    tenant = Tenant("a", "interactive", "id1", rpm=2)
    await limiter.check(tenant, 1, now=100.0)
    await limiter.check(tenant, 1, now=100.0)
    with pytest.raises(RateLimited) as info:
        await limiter.check(tenant, 1, now=100.0)
    assert info.value.headers() == {"Retry-After": "30"}
    await limiter.check(tenant, 1, now=130.5)  # half a minute refills one request


@pytest.mark.anyio
async def test_tpm_limit_counts_tokens_and_returns_the_request() -> None:
    limiter = RateLimiter()
    tenant = Tenant("a", "interactive", "id2", rpm=100, tpm=1000)
    await limiter.check(tenant, 900, now=0.0)
    with pytest.raises(RateLimited) as info:
        await limiter.check(tenant, 300, now=0.0)
    assert info.value.code == "tokens_rate_limit_exceeded"
    assert int(info.value.headers()["Retry-After"]) == 12  # 200 tokens at 1000/min
    await limiter.check(tenant, 100, now=0.0)  # smaller requests still fit
