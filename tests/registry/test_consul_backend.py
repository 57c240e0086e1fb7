"""Consul-specific behaviour: connection settings, ACL, failures, wire shapes."""

from __future__ import annotations

import asyncio
import base64
import itertools
import json
from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import pytest
from prometheus_client import CollectorRegistry
from starlette.types import ASGIApp, Receive, Scope, Send

from hybrid_llm.local.servers import UvicornThread, free_port
from servekit.config import load_settings
from servekit.engine.protocol import LoadReport
from servekit.registry.consul import ConsulRegistry, resolve_connection
from servekit.registry.heartbeat import Heartbeater
from servekit.registry.protocol import (
    AccessFiltered,
    InstanceInfo,
    RegistryError,
    RegistryRejected,
    RegistryUnavailable,
)
from servekit.registry.settings import ConsulSettings, RegistrySettings
from servekit.registry.view import CatalogView
from tests.registry.conftest import consul_datacenter, consul_settings
from tests.registry.consul_acl import ALL_RIGHTS, Acl
from tests.registry.consul_double import AgentConfig, ConsulAgent, ConsulDouble, ConsulState

pytestmark = pytest.mark.anyio


@pytest.fixture
async def http() -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient(timeout=5.0) as client:
        yield client


INFO = InstanceInfo(
    id="edge-eu-1",
    tier="edge",
    region="eu",
    address="10.0.0.5",
    port=8101,
    model="smollm2",
    version="v2",
    capacity=2,
    tags=("l4",),
    meta={"zone": "b"},
)


def test_connection_comes_from_the_environment() -> None:
    env = {
        "CONSUL_HTTP_ADDR": "https://consul.internal:8501",
        "CONSUL_HTTP_TOKEN": "env-token",
        "CONSUL_CACERT": "/etc/consul/ca.pem",
        "CONSUL_CLIENT_CERT": "/etc/consul/client.pem",
        "CONSUL_CLIENT_KEY": "/etc/consul/client-key.pem",
    }
    conn = resolve_connection(ConsulSettings(), env)
    assert (conn.scheme, conn.host, conn.port) == ("https", "consul.internal", 8501)
    assert conn.token == "env-token"
    assert conn.verify == "/etc/consul/ca.pem"
    assert conn.cert == ("/etc/consul/client.pem", "/etc/consul/client-key.pem")

    env = {"CONSUL_HTTP_ADDR": "c:8500", "CONSUL_HTTP_SSL": "true", "CONSUL_HTTP_SSL_VERIFY": "0"}
    conn = resolve_connection(ConsulSettings(), env)
    assert (conn.scheme, conn.host, conn.port, conn.verify) == ("https", "c", 8500, False)

    defaults = resolve_connection(ConsulSettings(), {})
    assert (defaults.scheme, defaults.host, defaults.port) == ("http", "127.0.0.1", 8500)
    assert defaults.token is None
    assert defaults.verify is True
    assert defaults.cert is None


def test_settings_win_over_the_environment() -> None:
    settings = ConsulSettings.model_validate(
        {"address": "10.1.1.1:9500", "token": "file-token", "ca_cert": "/ca.pem", "scheme": "https"}
    )
    conn = resolve_connection(
        settings, {"CONSUL_HTTP_ADDR": "elsewhere:1", "CONSUL_HTTP_TOKEN": "env-token"}
    )
    assert (conn.scheme, conn.host, conn.port) == ("https", "10.1.1.1", 9500)
    assert conn.token == "file-token"
    assert conn.verify == "/ca.pem"
    registry = ConsulRegistry(settings, {"CONSUL_HTTP_TOKEN": "env-token"})
    assert registry._client.token == "file-token"  # py-consul would have let the env win
    assert registry._client.http.base_uri == "https://10.1.1.1:9500"
    assert registry._client.http.verify == "/ca.pem"


async def test_acl_token_is_sent_and_a_wrong_one_is_an_error() -> None:
    state = ConsulState(acl_token="s3cret")
    with UvicornThread(ConsulDouble(state).app()) as server:
        good = ConsulRegistry(consul_settings(server.url), {"CONSUL_HTTP_TOKEN": "s3cret"})
        bad = ConsulRegistry(consul_settings(server.url, token="wrong"), {})
        try:
            await good.put("k", b"v")
            assert (await good.get("k")) is not None
            with pytest.raises(RegistryError) as caught:
                await bad.get("k")
            assert not isinstance(caught.value, RegistryUnavailable)
        finally:
            await good.aclose()
            await bad.aclose()


async def test_the_acl_token_comes_from_a_file_as_systemd_hands_it_over(tmp_path: Path) -> None:
    creds = tmp_path / "credentials"
    creds.mkdir()
    (creds / "consul-token").write_text("s3cret\n")
    state = ConsulState(acl_token="s3cret")
    with UvicornThread(ConsulDouble(state).app()) as server:
        cfg = tmp_path / "registry.yaml"
        cfg.write_text(
            f"backend: consul\nconsul:\n  address: '{server.url}'\n"
            "  token_file: $CREDENTIALS_DIRECTORY/consul-token\n"
        )
        settings = load_settings(RegistrySettings, cfg, {"CREDENTIALS_DIRECTORY": str(creds)})
        from_settings = ConsulRegistry(settings.consul, {})
        # Consul's own variable for a token file works as the fallback too.
        from_env = ConsulRegistry(
            consul_settings(server.url), {"CONSUL_HTTP_TOKEN_FILE": str(creds / "consul-token")}
        )
        try:
            await from_settings.put("k", b"v")
            assert (await from_env.get("k")) is not None
        finally:
            await from_settings.aclose()
            await from_env.aclose()
    assert "s3cret" not in repr(settings)
    with pytest.raises(RegistryError, match="CONSUL_HTTP_TOKEN_FILE: cannot read"):
        resolve_connection(ConsulSettings(), {"CONSUL_HTTP_TOKEN_FILE": str(tmp_path / "none")})


async def test_unreachable_and_leaderless_agents_are_unavailable() -> None:
    down = ConsulRegistry(consul_settings(f"127.0.0.1:{free_port()}"), {})
    try:
        with pytest.raises(RegistryUnavailable):
            await down.instances()
        with pytest.raises(RegistryUnavailable):
            await down.heartbeat("x", LoadReport())
    finally:
        await down.aclose()

    state = ConsulState(leader=False)
    with UvicornThread(ConsulDouble(state).app()) as server:
        leaderless = ConsulRegistry(consul_settings(server.url), {})
        try:
            with pytest.raises(RegistryUnavailable, match="No cluster leader"):
                await leaderless.watch_instances(0, 1.0)
            with pytest.raises(RegistryUnavailable):
                await leaderless.put_if("k", b"v", 0)
        finally:
            await leaderless.aclose()


async def test_registration_and_heartbeat_on_the_wire(
    consul_server: UvicornThread, consul_state: ConsulState, http: httpx.AsyncClient
) -> None:
    registry = ConsulRegistry(consul_settings(consul_server.url), {})
    try:
        await registry.register(INFO, ttl_s=1.5)
        await registry.heartbeat(INFO.id, LoadReport(ready=True, waiting=4, model="smollm2"))
        check = consul_state.agent("consul-double").checks[f"service:{INFO.id}"]
        assert check.ttl_s == 1.5
        assert check.deregister_after_s == 60.0  # 1.5 s asked; the agent's floor is 1m

        resp = await http.get(consul_server.url + "/v1/health/service/hybrid-llm?passing=1")
        assert resp.status_code == 200
        assert int(resp.headers["X-Consul-Index"]) > 0
        assert resp.headers["X-Consul-KnownLeader"] == "true"
        (entry,) = resp.json()
        service = entry["Service"]
        assert (service["ID"], service["Service"], service["Address"], service["Port"]) == (
            INFO.id, "hybrid-llm", "10.0.0.5", 8101)  # fmt: skip
        assert service["Tags"] == ["l4"]
        assert service["Meta"] == {"tier": "edge", "region": "eu", "model": "smollm2",
                                   "version": "v2", "capacity": "2", "x-zone": "b"}  # fmt: skip
        own = [c for c in entry["Checks"] if c["CheckID"] == f"service:{INFO.id}"]
        assert own[0]["Status"] == "passing"
        assert json.loads(own[0]["Output"])["waiting"] == 4

        (state,) = await registry.instances()
        assert state.info == INFO
        assert state.load.waiting == 4
    finally:
        await registry.aclose()


async def test_foreign_service_without_meta_still_lists(
    consul_server: UvicornThread, http: httpx.AsyncClient
) -> None:
    # Registered by hand (no Meta: Consul returns "Meta": null, no Address).
    body = {"Name": "hybrid-llm", "ID": "hand-made", "Port": 7000,
            "Check": {"TTL": "30s", "Status": "passing"}}  # fmt: skip
    assert (
        await http.put(consul_server.url + "/v1/agent/service/register", json=body)
    ).status_code == 200
    entry = (await http.get(consul_server.url + "/v1/health/service/hybrid-llm")).json()[0]
    assert entry["Service"]["Meta"] is None
    registry = ConsulRegistry(consul_settings(consul_server.url), {})
    try:
        (state,) = await registry.instances()
        assert state.info.id == "hand-made"
        assert state.info.address == "127.0.0.1"  # falls back to the node's address
        assert state.info.region == ""
        assert state.load == LoadReport()
    finally:
        await registry.aclose()


async def test_kv_and_lock_on_the_wire(
    consul_server: UvicornThread, http: httpx.AsyncClient
) -> None:
    registry = ConsulRegistry(consul_settings(consul_server.url), {})
    try:
        missing = await http.get(consul_server.url + "/v1/kv/desired/x")
        assert missing.status_code == 404
        assert "X-Consul-Index" in missing.headers

        await registry.put("desired/x", b"\x00v1")
        lock = await registry.acquire_lock("locks/rollout", "cli@host", ttl_s=10)
        assert lock is not None
        (entry,) = (await http.get(consul_server.url + "/v1/kv/desired/x")).json()
        assert base64.b64decode(entry["Value"]) == b"\x00v1"
        assert entry["Flags"] == 0
        assert entry["LockIndex"] == 0
        assert "Session" not in entry
        (held,) = (await http.get(consul_server.url + "/v1/kv/locks/rollout")).json()
        assert held["Session"] == lock.session
        assert held["LockIndex"] == 1
        assert json.loads(base64.b64decode(held["Value"])) == {"holder": "cli@host"}
        kv = await registry.get("locks/rollout")
        assert kv is not None
        assert kv.session == lock.session

        await registry.release_lock(lock)
        (released,) = (await http.get(consul_server.url + "/v1/kv/locks/rollout")).json()
        assert "Session" not in released
        session = await http.put(consul_server.url + f"/v1/session/renew/{lock.session}")
        assert session.status_code == 404  # destroyed on release
    finally:
        await registry.aclose()


async def test_watch_index_going_backwards_resets(
    consul_server: UvicornThread, consul_state: ConsulState
) -> None:
    registry = ConsulRegistry(consul_settings(consul_server.url), {})
    try:
        await registry.register(INFO, ttl_s=30)
        index, _ = await registry.watch_instances(0, 1.0)
        consul_state.rewind(by=1000)
        lower, states = await registry.watch_instances(index, 0.3)
        assert 1 <= lower < index
        assert [s.info.id for s in states] == [INFO.id]
    finally:
        await registry.aclose()


async def test_session_ttl_below_the_agent_minimum_is_refused(http: httpx.AsyncClient) -> None:
    state = ConsulState()  # Consul's default session_ttl_min of 10s
    with UvicornThread(ConsulDouble(state).app()) as server:
        r = await http.put(server.url + "/v1/session/create", json={"TTL": "5s"})
        assert r.status_code == 500
        assert "Invalid Session TTL" in r.text
        r = await http.put(server.url + "/v1/session/create", json={"TTL": "15s", "LockDelay": 3})
        (session,) = (await http.get(server.url + f"/v1/session/info/{r.json()['ID']}")).json()
        assert session["LockDelay"] == 3_000_000_000  # small numbers are seconds
        assert session["TTL"] == "15s"


# -- how a real agent behaves (the double's agent at Consul's defaults) -------


async def test_invalid_meta_fails_fast_naming_the_key(
    consul_server: UvicornThread, consul_state: ConsulState
) -> None:
    registry = ConsulRegistry(consul_settings(consul_server.url), {})
    bad = InstanceInfo("e1", "edge", "eu", "10.0.0.5", 8101, "m", meta={"gpu.model": "L4"})
    try:
        before = consul_state.requests
        with pytest.raises(RegistryRejected, match=r"meta key 'gpu\.model' is invalid"):
            await registry.register(bad, ttl_s=10)
        assert consul_state.requests == before  # refused before asking the agent
        beater = Heartbeater(registry, bad, LoadReport, 0.1, 2.0)
        with pytest.raises(RegistryRejected, match=r"gpu\.model"):
            await beater.start()  # the service refuses to start
        long_value = InstanceInfo("e1", "edge", "eu", "h", 1, "m", version="v" * 513)
        with pytest.raises(RegistryRejected, match="'version' has a value of 513 bytes"):
            await registry.register(long_value, ttl_s=10)
    finally:
        await registry.aclose()


async def test_a_request_the_agent_refuses_stops_the_heartbeater(
    consul_server: UvicornThread, consul_state: ConsulState, caplog: pytest.LogCaptureFixture
) -> None:
    registry = ConsulRegistry(consul_settings(consul_server.url), {})
    anywhere = InstanceInfo("e1", "edge", "eu", "0.0.0.0", 8101, "m")  # agent: 400
    beater = Heartbeater(registry, anywhere, lambda: LoadReport(ready=True), 0.05, 2.0)
    try:
        await beater.start()
        for _ in range(100):
            if beater.rejected is not None:
                break
            await asyncio.sleep(0.02)
        assert beater.rejected is not None
        assert "Invalid service address" in str(beater.rejected)
        asked = consul_state.requests
        await asyncio.sleep(0.3)  # six intervals: no retry loop
        assert consul_state.requests == asked
        assert beater.registrations == 0
        assert any(r.levelname == "ERROR" and "no longer retrying" in r.message
                   for r in caplog.records)  # fmt: skip
    finally:
        await beater.stop(deregister=False)
        await registry.aclose()


async def test_figures_lag_but_readiness_and_draining_do_not(
    consul_server: UvicornThread, consul_state: ConsulState
) -> None:
    # Consul's default check_update_interval (5m): figures-only beats wait.
    registry = ConsulRegistry(consul_settings(consul_server.url), {})
    try:
        await registry.register(INFO, ttl_s=30)
        (fresh,) = await registry.instances()
        assert fresh.healthy
        assert not fresh.load.ready  # registered alive, not yet serving
        await registry.heartbeat(INFO.id, LoadReport(ready=True, running=1))
        (ready,) = await registry.instances()
        assert (ready.load.ready, ready.load.running) == (True, 1)  # a status change: at once

        await registry.heartbeat(INFO.id, LoadReport(ready=True, running=7))
        await asyncio.sleep(0.3)
        (late,) = await registry.instances()
        assert late.load.running == 1  # figures only: still the old report
        assert consul_state.agent("consul-double").checks[f"service:{INFO.id}"].defer_at

        await registry.heartbeat(INFO.id, LoadReport(ready=False, draining=True, running=7))
        (draining,) = await registry.instances()
        assert draining.healthy  # still listed while in-flight requests finish
        assert draining.load.draining
        assert draining.load.running == 7
        assert consul_state.check(f"service:{INFO.id}").status == "warning"
    finally:
        await registry.aclose()


async def test_acl_filtered_listings_are_errors_not_an_empty_fleet(
    caplog: pytest.LogCaptureFixture,
) -> None:
    acl = Acl(tokens={"writer": ALL_RIGHTS, "kv-only": frozenset({"key:write", "session:write"})})
    state = ConsulState(acl=acl)
    with UvicornThread(ConsulDouble(state).app()) as server:
        writer = ConsulRegistry(consul_settings(server.url, token="writer"), {})
        reader = ConsulRegistry(consul_settings(server.url, token="kv-only"), {})
        metrics = CollectorRegistry()
        view = CatalogView(reader, wait_s=0.5, retry_initial_s=0.05, metrics_registry=metrics)
        try:
            await writer.register(INFO, ttl_s=30)
            await writer.heartbeat(INFO.id, LoadReport(ready=True))
            with pytest.raises(AccessFiltered, match="service:read and node:read"):
                await reader.instances()
            await view.start()
            for _ in range(100):
                if metrics.get_sample_value(
                    "registry_catalog_errors_total", {"kind": "acl_filtered"}
                ):
                    break
                await asyncio.sleep(0.02)
            assert view.stale
            assert view.snapshot() == []
            assert isinstance(view.last_error, AccessFiltered)
            assert metrics.get_sample_value("registry_catalog_stale") == 1
            errors = [r for r in caplog.records if r.levelname == "ERROR"]
            assert any("ACLs hid part of the instances" in r.message for r in errors)

            await writer.put("models/m/traffic", b"{}")
            blind = ConsulRegistry(consul_settings(server.url, token="writer"), {})
            try:
                assert [e.key for e in await blind.list_prefix("models/")] == ["models/m/traffic"]
            finally:
                await blind.aclose()
        finally:
            await view.aclose()
            await writer.aclose()
            await reader.aclose()


class RoundRobin:
    """A load balancer in front of several agents: each request to the next one."""

    def __init__(self, *apps: ASGIApp) -> None:
        self._apps = itertools.cycle(apps)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        app = next(self._apps) if scope["type"] == "http" else None
        if app is not None:
            await app(scope, receive, send)


async def test_beats_through_a_load_balancer_are_reported_not_registered_twice(
    caplog: pytest.LogCaptureFixture,
) -> None:
    state = consul_datacenter()
    other = ConsulAgent(state, node="edge-a-018")
    balancer = RoundRobin(ConsulDouble(state).app(), ConsulDouble(agent=other).app())
    with UvicornThread(balancer) as lb:
        registry = ConsulRegistry(consul_settings(lb.url), {})
        beater = Heartbeater(registry, INFO, lambda: LoadReport(ready=True), 0.05, 30.0)
        try:
            await beater.start()
            await asyncio.sleep(0.5)
            assert beater.registrations == 1  # on consul-double, through the balancer
            assert beater.failures >= 2  # every beat reached edge-a-018
            assert other.services == {}  # ...which never got a second copy
            assert any(
                r.levelname == "ERROR" and "does not hold it" in r.message
                and "alive on consul-double" in r.message for r in caplog.records
            )  # fmt: skip
        finally:
            await beater.stop(deregister=False)
            await registry.aclose()


async def test_the_same_instance_on_two_nodes_lists_once() -> None:
    state = consul_datacenter()
    other = ConsulAgent(state, node="edge-a-018")
    with (
        UvicornThread(ConsulDouble(state).app()) as first,
        UvicornThread(ConsulDouble(agent=other).app()) as second,
    ):
        a = ConsulRegistry(consul_settings(first.url), {})
        b = ConsulRegistry(consul_settings(second.url), {})
        try:
            await a.register(INFO, ttl_s=30)
            await b.register(INFO, ttl_s=30)
            await b.heartbeat(INFO.id, LoadReport(ready=True, running=3))
            (one,) = await a.instances()
            assert one.load.running == 3  # the copy that is beating wins
        finally:
            await a.aclose()
            await b.aclose()


@pytest.mark.parametrize(
    ("config", "expected"),
    [
        ({}, ["forwards load-only heartbeats to the catalog after up to 450s"]),
        ({"check_update_interval_s": 30.0}, []),
        ({"check_update_interval_s": 0.0}, ["every heartbeat becomes a catalog write"]),
        ({"check_update_interval_s": 30.0, "discard_check_output": True},
         ["discards check output"]),
    ],
)  # fmt: skip
async def test_the_agent_check_warns_about_settings_that_make_load_stale(
    config: dict[str, object], expected: list[str], caplog: pytest.LogCaptureFixture
) -> None:
    state = ConsulState()
    ConsulAgent(state, node="consul-double", config=AgentConfig(**config))  # type: ignore[arg-type]
    with UvicornThread(ConsulDouble(state).app()) as server:
        registry = ConsulRegistry(consul_settings(server.url), {})
        try:
            warnings = await registry.check_agent()
        finally:
            await registry.aclose()
    assert len(warnings) == len(expected)
    for warning, text in zip(warnings, expected, strict=True):
        assert text in warning
        assert any(r.levelname == "WARNING" and r.message == warning for r in caplog.records)


async def test_the_agent_check_warns_when_registrations_land_in_another_datacenter() -> None:
    with UvicornThread(ConsulDouble(ConsulState(datacenter="region-a")).app()) as server:
        registry = ConsulRegistry(consul_settings(server.url, datacenter="region-b"), {})
        try:
            warnings = await registry.check_agent()
        finally:
            await registry.aclose()
    assert any("register through their local agent into 'region-a'" in w for w in warnings)


async def test_a_lock_ttl_below_the_servers_minimum_is_refused_not_unavailable(
    consul_server: UvicornThread,
) -> None:
    registry = ConsulRegistry(consul_settings(consul_server.url), {})
    try:
        with pytest.raises(RegistryRejected, match="lock TTL 5s refused"):
            await registry.acquire_lock("locks/rollout", "cli", ttl_s=5)
    finally:
        await registry.aclose()
