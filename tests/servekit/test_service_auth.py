"""Service tokens: the guard in front of a service, its digests, rotation and reload."""

from __future__ import annotations

import httpx
import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import PlainTextResponse
from starlette.routing import Route

from servekit.service_auth import (
    DigestSet,
    ServiceAuth,
    ServiceAuthSettings,
    TokenGate,
    hash_token,
)

pytestmark = pytest.mark.anyio


def guarded(gate: TokenGate) -> httpx.AsyncClient:
    async def hello(request: Request) -> PlainTextResponse:
        return PlainTextResponse(request.url.path)

    paths = ["/health", "/ready", "/metrics", "/load", "/v1/chat/completions"]
    app = Starlette(routes=[Route(p, hello, methods=["GET", "POST"]) for p in paths])
    transport = httpx.ASGITransport(app=ServiceAuth(app, gate))
    return httpx.AsyncClient(transport=transport, base_url="http://svc")


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


def assert_401(resp: httpx.Response, code: str) -> None:
    assert resp.status_code == 401, resp.text
    assert resp.headers["www-authenticate"].startswith("Bearer")
    err = resp.json()["error"]
    assert set(err) == {"message", "type", "param", "code"}
    assert (err["type"], err["code"]) == ("authentication_error", code)


async def test_without_or_with_a_wrong_token_401_and_with_the_token_served() -> None:
    gate = TokenGate(ServiceAuthSettings(tokens=["svc-1"]))  # type: ignore[list-item]
    async with guarded(gate) as c:
        assert_401(await c.post("/v1/chat/completions"), "missing_api_key")
        assert_401(await c.get("/load", headers=bearer("svc-2")), "invalid_api_key")
        assert_401(
            await c.get("/load", headers={"Authorization": "Basic c3ZjLTE="}), "missing_api_key"
        )
        ok = await c.post("/v1/chat/completions", headers=bearer("svc-1"))
        assert (ok.status_code, ok.text) == (200, "/v1/chat/completions")


async def test_health_ready_and_by_default_metrics_stay_open() -> None:
    settings = ServiceAuthSettings(sha256=[hash_token("svc-1")])
    async with guarded(TokenGate(settings)) as c:
        for path in ("/health", "/ready", "/metrics"):
            assert (await c.get(path)).status_code == 200
        assert_401(await c.get("/load"), "missing_api_key")
    protected = TokenGate(settings.model_copy(update={"protect_metrics": True}))
    async with guarded(protected) as c:
        assert_401(await c.get("/metrics"), "missing_api_key")
        assert (await c.get("/metrics", headers=bearer("svc-1"))).status_code == 200


async def test_rotation_both_tokens_while_both_listed_then_only_the_new_one() -> None:
    gate = TokenGate(ServiceAuthSettings(tokens=["old"]))  # type: ignore[list-item]
    async with guarded(gate) as c:
        assert (await c.get("/load", headers=bearer("old"))).status_code == 200
        # Step 1: the new token is added beside the old one (settings reload).
        gate.update(ServiceAuthSettings(tokens=["new", "old"]))  # type: ignore[list-item]
        assert (await c.get("/load", headers=bearer("old"))).status_code == 200
        assert (await c.get("/load", headers=bearer("new"))).status_code == 200
        # Step 2: callers moved over; the old token goes, even for a caller seen before.
        gate.update(ServiceAuthSettings(sha256=[hash_token("new")]))
        assert_401(await c.get("/load", headers=bearer("old")), "invalid_api_key")
        assert (await c.get("/load", headers=bearer("new"))).status_code == 200


async def test_no_token_configured_lets_everything_through() -> None:
    async with guarded(TokenGate()) as c:
        assert (await c.get("/load")).status_code == 200


def test_digest_set_finds_the_matching_digest_among_all() -> None:
    digests = DigestSet([hash_token("a"), hash_token("b"), hash_token("c")])
    assert [digests.match(t) for t in ("a", "b", "c", "d")] == [0, 1, 2, None]
    assert digests.match_header("Bearer b") == 1
    assert digests.match_header("bearer   c  ") == 2
    assert digests.match_header("Bearer nope") is None
    assert digests.match_header(None) is None


def test_sha256_entries_must_be_digests() -> None:
    with pytest.raises(ValueError, match="64 hex digits"):
        ServiceAuthSettings(sha256=["svc-1"])
