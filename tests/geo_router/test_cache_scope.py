"""Cache scopes: one tenant cannot learn from the router what another recently sent.

Each key's requests go upstream with the ``cache_salt`` of its cache scope (its
tenant's own unless it names a shared scope), and placement by cached prefix
counts only what the same scope left on an instance.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from edge_agent.app import create_app as edge_app
from edge_agent.settings import EdgeSettings
from geo_router.auth import Authenticator, Tenant
from geo_router.auth_settings import AuthSettings, hash_key
from geo_router.continuation import Partial
from geo_router.request import RouteRequest, continued, upstream_body
from hybrid_llm.local.servers import UvicornThread, wait_ready
from servekit.engine.protocol import LoadReport
from servekit.prefix_blocks import sampled
from tests.geo_router.conftest import KEY, router_settings, serve_fake, upstream
from tests.geo_router.fake_upstream import Behavior
from tests.geo_router.test_isolation import CHAT, router
from tests.geo_router.test_placement import EAST, inst, planner, support


def keys(*entries: dict[str, Any]) -> list[dict[str, Any]]:
    return [{"sha256": hash_key(f"sk-{i}"), **e} for i, e in enumerate(entries)]


def tenants(*entries: dict[str, Any], **auth: Any) -> list[Tenant]:
    gate = Authenticator(AuthSettings.model_validate({"keys": keys(*entries), **auth}))
    return [gate.authenticate(f"Bearer sk-{i}") for i in range(len(entries))]


def test_each_tenant_has_its_own_salt_and_a_named_scope_is_shared() -> None:
    acme, acme2, evil, a, b, other = tenants(
        {"tenant": "acme"},
        {"tenant": "acme"},  # a second key of the same tenant
        {"tenant": "evil"},
        {"tenant": "a", "cache_scope": "shared"},
        {"tenant": "b", "cache_scope": "shared"},
        {"tenant": "c", "cache_scope": "acme"},  # a scope's name is not a tenant's scope
    )
    assert acme.cache_salt == acme2.cache_salt
    assert a.cache_salt == b.cache_salt
    salts = {acme.cache_salt, evil.cache_salt, a.cache_salt, other.cache_salt}
    assert len(salts) == 4
    anonymous = Authenticator(AuthSettings(required=False)).authenticate(None)
    assert anonymous.cache_salt not in salts
    for salt in salts:  # what vLLM accepts, and opaque
        assert salt is not None
        assert len(salt) == 64
        assert all(c in "0123456789abcdef" for c in salt)


def test_the_salt_is_keyed_by_the_routers_secret() -> None:
    (default,) = tenants({"tenant": "acme"})
    (keyed,) = tenants({"tenant": "acme"}, cache_salt_key="k" * 32)
    (from_env,) = tenants({"tenant": "acme"}, cache_salt_key_env="SALT_KEY")
    assert keyed.cache_salt != default.cache_salt
    assert from_env.cache_salt == keyed.cache_salt
    assert "k" * 32 not in repr(AuthSettings(cache_salt_key="k" * 32))  # type: ignore[arg-type]


@pytest.fixture(autouse=True)
def _salt_env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SALT_KEY", "k" * 32)


@pytest.mark.anyio
async def test_the_tenants_salt_is_forwarded_and_a_clients_is_refused() -> None:
    edge = Behavior()
    settings = router_settings([])
    with serve_fake(edge) as url:
        async with router(router_settings([upstream(url)])) as c:
            auth = {"Authorization": f"Bearer {KEY}"}
            ok = await c.post("/v1/chat/completions", json=CHAT, headers=auth)
            body = {**CHAT, "cache_salt": "victim"}
            refused = await c.post("/v1/chat/completions", json=body, headers=auth)
    assert ok.status_code == 200, ok.text
    assert refused.status_code == 400
    assert refused.json()["error"]["code"] == "unknown_parameter"
    (sent,) = [s["body"] for s in edge.seen]
    gate = Authenticator(settings.auth)
    assert sent["cache_salt"] == gate.authenticate(f"Bearer {KEY}").cache_salt


def test_another_tenants_cached_prefix_earns_no_placement_credit() -> None:
    acme, evil, a, b = tenants(
        {"tenant": "acme"},
        {"tenant": "evil"},
        {"tenant": "a", "cache_scope": "shared"},
        {"tenant": "b", "cache_scope": "shared"},
    )
    states = [inst(i, prefill_tokens_per_s=150.0) for i in ("edge-a", "edge-b")]
    p, index, _ = planner(states)

    def cached(tenant: Tenant) -> dict[str, int]:
        d = p.plan(support("Hours?"), EAST, "u", tenant=tenant.name, cache_salt=tenant.cache_salt)
        return {c.id: c.cached_tokens for c in d.candidates}

    first = p.plan(support("Hours?"), EAST, "u", cache_salt=acme.cache_salt).candidates[0]
    assert first.prefix is not None
    index.record(first.id, first.prefix)  # acme's system prompt is on one edge now
    assert cached(acme)[first.id] > 300
    assert set(cached(evil).values()) == {0}  # the same text, another scope: nothing

    shared = p.plan(support("Hours?"), EAST, "u", cache_salt=a.cache_salt).candidates[0]
    assert shared.prefix is not None
    index.record(shared.id, shared.prefix)
    assert cached(b)[shared.id] > 300  # b shares a's scope on purpose


def test_an_instances_report_vouches_only_for_the_scope_its_slots_hold() -> None:
    acme, evil = tenants({"tenant": "acme"}, {"tenant": "evil"})
    states = [inst("edge-a", prefill_tokens_per_s=150.0)]
    p, index, _ = planner(states)
    held = p.shape(support("Hours?"), acme.cache_salt).prefix
    # The engine names what its slot holds in the slot's scope (servekit.prefix_blocks).
    report = LoadReport(ready=True, prefix_blocks=tuple(sampled(held.blocks, 4)))
    report = LoadReport(**{**report.to_dict(), "prefix_block_chars": 64})
    for tenant, hit in ((acme, True), (evil, False)):
        prefix = p.shape(support("Hours?"), tenant.cache_salt).prefix
        found = index.cached_blocks("edge-a", prefix, report)
        assert (found.blocks > 0) is hit


@pytest.mark.model
@pytest.mark.anyio
async def test_through_a_real_edge_another_tenant_sees_no_cached_tokens(model_path: Path) -> None:
    edge = EdgeSettings.model_validate(
        {
            "instance": {"id": "edge-e2e", "region": "east", "version": "v1"},
            "engine": {"kind": "llama-batching", "model_path": str(model_path),
                       "model_name": "smol", "slots": 2, "ctx_per_slot": 512,
                       "chunk_tokens": 64, "n_threads": 2, "warmup_tokens": 2},
            "server": {"log_level": "warning"},
        }
    )  # fmt: skip
    entries = keys(
        {"tenant": "acme"},
        {"tenant": "evil"},
        {"tenant": "a", "cache_scope": "shared"},
        {"tenant": "b", "cache_scope": "shared"},
    )
    body = {"model": "auto", "max_tokens": 2, "temperature": 0, "messages": [
        {"role": "system", "content": "You help the Harbour Street library's readers. " * 10},
        {"role": "user", "content": "When do you open on Sundays?"},
    ]}  # fmt: skip

    with UvicornThread(edge_app(edge)) as server:
        wait_ready(server.url, timeout=120)
        settings = router_settings([upstream(server.url)], auth={"keys": entries})
        async with router(settings) as c:

            async def cached(key: int) -> int:
                headers = {"Authorization": f"Bearer sk-{key}"}
                r = await c.post("/v1/chat/completions", json=body, headers=headers)
                assert r.status_code == 200, r.text
                usage = r.json()["usage"]
                assert usage["prompt_tokens"] > 80
                return int(usage.get("prompt_tokens_details", {}).get("cached_tokens", 0))

            assert await cached(0) == 0  # acme sends it first
            assert await cached(1) == 0  # evil probes with the same text: no hit
            assert await cached(0) > 80  # acme's own cache still serves acme
            assert await cached(2) == 0
            assert await cached(3) > 80  # b shares a's scope on purpose


def test_a_continuation_goes_on_in_the_same_scope() -> None:
    p, _, _ = planner([inst("edge-a", prefill_tokens_per_s=150.0)])
    body = support("Hours?")
    cand = p.plan(body, EAST, "u").candidates[0]
    req = RouteRequest(body, "chat", "/v1/chat/completions", EAST, "u", {}, 0.0, cache_salt="s1")
    resumed = continued(req, Partial("We open at", 3))
    assert resumed is not None
    assert json.loads(upstream_body(resumed, cand))["cache_salt"] == "s1"
    plain = RouteRequest(body, "chat", "/v1/chat/completions", EAST, "u", {}, 0.0)
    assert "cache_salt" not in json.loads(upstream_body(plain, cand))


@pytest.mark.anyio
async def test_a_next_turn_is_credited_the_answer_its_instance_streamed() -> None:
    """Engines keep an answer's tokens beside the prompt's, and the next turn sends the
    answer back: sent before the instance's next report, it was credited only its
    first turn's prompt (chat through ``hybrid-llm up``: 0 tokens known), and moved."""
    question = "Describe, step by step, how a lighthouse keeper starts the day. " * 2
    first = [{"role": "user", "content": question}]
    operator = {"Authorization": f"Bearer {KEY}"}
    with serve_fake(Behavior(words=40)) as url:
        async with router(router_settings([upstream(url)])) as c:
            r = await c.post(
                "/v1/chat/completions", json={"model": "auto", "messages": first}, headers=operator
            )
            assert r.status_code == 200, r.text
            answer = r.json()["choices"][0]["message"]["content"]
            assert len(answer) > 128

            async def cached(said: str) -> int:
                history = [*first, {"role": "assistant", "content": said}]
                body = {
                    "model": "auto",
                    "messages": [*history, {"role": "user", "content": "And at night?"}],
                }
                r = await c.post("/v1/route/explain", json=body, headers=operator)
                assert r.status_code == 200, r.text
                return int(r.json()["candidates"][0]["cached_tokens"])

            # The same answer but its first character: the question's blocks alone.
            elsewhere = await cached("X" + answer[1:])
            assert await cached(answer) >= 2 * elsewhere > 0
