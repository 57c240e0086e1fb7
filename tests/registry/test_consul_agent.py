"""The Consul double behaves like a Consul agent, at Consul's default timings.

These pin the double to what Consul's source does (``agent/local/state.go``,
``agent/agent.go``, ``agent/structs``, ``agent/consul/kvs_endpoint.go``); the
backend's tests rely on it. Time is a hand-driven clock, so minutes pass at
once and every interval stays at its default.
"""

from __future__ import annotations

import json
import random
from collections.abc import AsyncIterator, Iterator

import httpx
import pytest

from hybrid_llm.local.servers import UvicornThread
from tests.registry.consul_acl import FILTERED_HEADER, Acl
from tests.registry.consul_double import AgentConfig, ConsulAgent, ConsulDouble, ConsulState
from tests.registry.consul_state import federate

pytestmark = pytest.mark.anyio


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def dc(clock: Clock) -> ConsulState:
    return ConsulState(clock=clock)


@pytest.fixture
def agent(dc: ConsulState) -> ConsulAgent:
    return ConsulAgent(dc, node="edge-a-017", rng=random.Random(7))


@pytest.fixture
def url(agent: ConsulAgent) -> Iterator[str]:
    with UvicornThread(ConsulDouble(agent=agent).app()) as server:
        yield server.url


@pytest.fixture
async def http() -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient(timeout=5.0) as client:
        yield client


def _service(sid: str = "e1", **check: object) -> dict[str, object]:
    return {"Name": "hybrid-llm", "ID": sid, "Port": 8101,
            "Check": {"TTL": "10s", "Status": "warning", **check}}  # fmt: skip


async def _output(http: httpx.AsyncClient, url: str, cid: str = "service:e1") -> tuple[str, str]:
    (entry,) = (await http.get(url + "/v1/health/service/hybrid-llm")).json()
    (own,) = [c for c in entry["Checks"] if c["CheckID"] == cid]
    return own["Status"], own["Output"]


async def test_output_only_updates_reach_the_catalog_minutes_late(
    http: httpx.AsyncClient, url: str, clock: Clock, agent: ConsulAgent
) -> None:
    hour = _service(TTL="1h")  # no TTL runs out while minutes pass
    assert (await http.put(url + "/v1/agent/service/register", json=hour)).status_code == 200
    await http.put(url + "/v1/agent/check/pass/service:e1", params={"note": "one"})
    assert await _output(http, url) == ("passing", "one")  # a status change: at once

    await http.put(url + "/v1/agent/check/pass/service:e1", params={"note": "two"})
    assert await _output(http, url) == ("passing", "one")  # output only: deferred
    clock.now += 149.0  # just short of check_update_interval / 2
    assert await _output(http, url) == ("passing", "one")
    assert agent.checks["service:e1"].defer_at is not None
    assert 1000 + 150 <= agent.checks["service:e1"].defer_at <= 1000 + 450
    clock.now = 1000 + 451.0  # past the longest stagger
    assert await _output(http, url) == ("passing", "two")


async def test_a_status_change_syncs_the_latest_output_at_once(
    http: httpx.AsyncClient, url: str
) -> None:
    await http.put(url + "/v1/agent/service/register", json=_service())
    await http.put(url + "/v1/agent/check/pass/service:e1", params={"note": "ready"})
    await http.put(url + "/v1/agent/check/pass/service:e1", params={"note": "busier"})
    await http.put(url + "/v1/agent/check/warn/service:e1", params={"note": "draining"})
    assert await _output(http, url) == ("warning", "draining")


async def test_re_registration_keeps_the_check_state(http: httpx.AsyncClient, url: str) -> None:
    await http.put(url + "/v1/agent/service/register", json=_service())
    await http.put(url + "/v1/agent/check/pass/service:e1", params={"note": "serving"})
    # New meta, and a check definition saying "warning": the agent keeps what it had.
    body = {**_service(), "Meta": {"version": "v2"}}
    assert (await http.put(url + "/v1/agent/service/register", json=body)).status_code == 200
    assert await _output(http, url) == ("passing", "serving")
    (entry,) = (await http.get(url + "/v1/health/service/hybrid-llm")).json()
    assert entry["Service"]["Meta"] == {"version": "v2"}  # the service itself syncs at once


async def test_registration_is_validated_like_consul(http: httpx.AsyncClient, url: str) -> None:
    with_output = await http.put(url + "/v1/agent/service/register",
                                 json=_service(Output="{}"))  # fmt: skip
    assert with_output.status_code == 400
    assert with_output.text == 'Request decode failed: json: unknown field "Output"'

    bad_meta = {**_service(), "Meta": {"gpu.model": "L4"}}
    r = await http.put(url + "/v1/agent/service/register", json=bad_meta)
    assert r.status_code == 400
    assert r.text == (
        "Invalid Service Meta: Couldn't load metadata pair ('gpu.model', 'L4'):"
        " Key contains invalid characters"
    )
    too_many = {**_service(), "Meta": {f"k{i}": "v" for i in range(65)}}
    r = await http.put(url + "/v1/agent/service/register", json=too_many)
    assert "cannot contain more than 64 key/value pairs" in r.text
    long_value = {**_service(), "Meta": {"k": "é" * 257}}  # 514 bytes
    r = await http.put(url + "/v1/agent/service/register", json=long_value)
    assert "Value is too long (limit: 512 characters)" in r.text
    anywhere = {**_service(), "Address": "0.0.0.0"}
    r = await http.put(url + "/v1/agent/service/register", json=anywhere)
    assert (r.status_code, r.text) == (400, "Invalid service address")
    assert (await http.get(url + "/v1/health/service/hybrid-llm")).json() == []


async def test_reaping_waits_for_the_floor_and_the_reaper_tick(
    http: httpx.AsyncClient, url: str, clock: Clock
) -> None:
    body = _service(DeregisterCriticalServiceAfter="1s")  # Consul raises it to 1m
    await http.put(url + "/v1/agent/service/register", json=body)
    await http.put(url + "/v1/agent/check/pass/service:e1", params={"note": "x"})
    clock.now += 10.0  # the TTL runs out at t=1010: critical
    status, output = await _output(http, url)
    assert status == "critical"
    assert output == "TTL expired (last output before timeout follows): x"
    clock.now = 1010 + 59.0
    assert len((await http.get(url + "/v1/health/service/hybrid-llm")).json()) == 1
    clock.now = 1010 + 61.0  # past the floor, but the reaper runs at t=1000+30k
    assert len((await http.get(url + "/v1/health/service/hybrid-llm")).json()) == 1
    clock.now = 1000 + 90.0
    assert (await http.get(url + "/v1/health/service/hybrid-llm")).json() == []


async def test_agent_endpoints_are_local_to_their_agent(
    http: httpx.AsyncClient, dc: ConsulState, url: str
) -> None:
    other = ConsulAgent(dc, node="edge-a-018", address="10.0.0.18")
    with UvicornThread(ConsulDouble(agent=other).app()) as second:
        await http.put(url + "/v1/agent/service/register", json=_service())
        beat = await http.put(second.url + "/v1/agent/check/pass/service:e1")
        assert beat.status_code == 404
        assert beat.text.startswith('Unknown check ID "service:e1"')
        # ...but the catalog, read through either agent, is the datacenter's.
        (entry,) = (await http.get(second.url + "/v1/health/service/hybrid-llm")).json()
        assert entry["Node"]["Node"] == "edge-a-017"


async def test_dc_routes_server_queries_but_not_agent_endpoints(
    http: httpx.AsyncClient, clock: Clock
) -> None:
    a, b = ConsulState(datacenter="region-a", clock=clock), ConsulState(
        datacenter="region-b", clock=clock)  # fmt: skip
    federate(a, b)
    agent_a = ConsulAgent(a, node="edge-a-1")
    with UvicornThread(ConsulDouble(agent=agent_a).app()) as server:
        r = await http.put(server.url + "/v1/agent/service/register?dc=region-b", json=_service())
        assert r.status_code == 200
        assert len((await http.get(server.url + "/v1/health/service/hybrid-llm")).json()) == 1
        remote = await http.get(server.url + "/v1/health/service/hybrid-llm?dc=region-b")
        assert remote.json() == []  # it registered in the agent's own datacenter
        await http.put(server.url + "/v1/kv/k?dc=region-b", content=b"v")
        assert "k" in b.kv
        assert "k" not in a.kv
        nowhere = await http.get(server.url + "/v1/health/service/hybrid-llm?dc=mars")
        assert (nowhere.status_code, nowhere.text) == (500, "No path to datacenter")


async def test_acls_filter_listings_and_say_so_only_to_a_token(
    http: httpx.AsyncClient, clock: Clock
) -> None:
    acl = Acl(tokens={"writer": frozenset({"service:write", "node:read", "key:write"}),
                      "blind": frozenset({"key:read"})})  # fmt: skip
    dc = ConsulState(acl=acl, clock=clock)
    with UvicornThread(ConsulDouble(dc).app()) as server:
        writer = {"X-Consul-Token": "writer"}
        await http.put(server.url + "/v1/agent/service/register", json=_service(), headers=writer)
        await http.put(server.url + "/v1/kv/a", content=b"1", headers=writer)
        seen = await http.get(server.url + "/v1/health/service/hybrid-llm", headers=writer)
        assert len(seen.json()) == 1
        assert FILTERED_HEADER not in seen.headers

        blind = await http.get(server.url + "/v1/health/service/hybrid-llm",
                               headers={"X-Consul-Token": "blind"})  # fmt: skip
        assert (blind.status_code, blind.json()) == (200, [])
        assert blind.headers[FILTERED_HEADER] == "true"
        anonymous = await http.get(server.url + "/v1/health/service/hybrid-llm")
        assert (anonymous.status_code, anonymous.json()) == (200, [])
        assert FILTERED_HEADER not in anonymous.headers  # maskResultsFilteredByACLs

        kv = await http.get(server.url + "/v1/kv/?recurse", headers={"X-Consul-Token": "x"})
        assert (kv.status_code, kv.text) == (403, "ACL not found")
        single = await http.get(server.url + "/v1/kv/a")  # KVS.Get denies
        assert single.status_code == 403
        listed = await http.get(server.url + "/v1/kv/?recurse")  # KVS.List filters
        assert listed.status_code == 404
        beat = await http.put(server.url + "/v1/agent/check/pass/service:e1",
                              headers={"X-Consul-Token": "blind"})  # fmt: skip
        assert beat.status_code == 403


async def test_agent_self_reports_the_runtime_config(
    http: httpx.AsyncClient, dc: ConsulState
) -> None:
    tuned = ConsulAgent(dc, node="edge-b", config=AgentConfig(check_update_interval_s=30.0))
    with UvicornThread(ConsulDouble(agent=tuned).app()) as server:
        body = (await http.get(server.url + "/v1/agent/self")).json()
    assert body["Config"]["NodeName"] == "edge-b"
    assert body["Config"]["Datacenter"] == "dc1"
    debug = body["DebugConfig"]
    assert debug["CheckUpdateInterval"] == "30s"
    assert debug["CheckDeregisterIntervalMin"] == "1m0s"
    assert debug["CheckReapInterval"] == "30s"
    assert debug["SessionTTLMin"] == "10s"
    assert json.dumps(debug)  # plain JSON
