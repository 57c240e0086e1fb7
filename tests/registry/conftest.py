"""Fixtures: each registry backend, fresh per test, against real storage.

``registry`` is parametrized over the embedded SQLite store and the Consul
backend talking to :mod:`tests.registry.consul_double` on a real socket, so
one contract suite runs against both.

The double's agent runs at Consul's own defaults (5m check_update_interval,
1m deregister floor reaped every 30s, 10s minimum session TTL). A test that
needs faster timings says which with ``@pytest.mark.consul_timings(...)``
(keyword arguments of :class:`AgentConfig`, plus ``session_ttl_min_s``).
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest

from hybrid_llm.local.servers import UvicornThread
from servekit.registry.consul import ConsulRegistry
from servekit.registry.embedded import EmbeddedRegistry
from servekit.registry.protocol import Registry
from servekit.registry.settings import ConsulSettings
from tests.registry.consul_double import AgentConfig, ConsulAgent, ConsulDouble, ConsulState

# Short enough for fast tests, long enough for a loaded 2-core box.
DEREGISTER_AFTER_S = 1.5

# What tests that cannot wait for Consul's reaper ask for.
FAST_REAP = {"check_reap_interval_s": 0.0, "check_deregister_interval_min_s": 0.0}


def lowered(request: pytest.FixtureRequest) -> dict[str, Any]:
    marker = request.node.get_closest_marker("consul_timings")
    return dict(marker.kwargs) if marker else {}


def consul_datacenter(**timings: Any) -> ConsulState:
    """A datacenter with one agent, at Consul's defaults unless ``timings`` lower them."""
    session_min = timings.pop("session_ttl_min_s", 10.0)
    state = ConsulState(session_ttl_min_s=session_min)
    ConsulAgent(state, node="consul-double", config=AgentConfig(**timings))
    return state


@pytest.fixture
def consul_state(request: pytest.FixtureRequest) -> ConsulState:
    return consul_datacenter(**lowered(request))


@pytest.fixture
def consul_server(consul_state: ConsulState) -> Iterator[UvicornThread]:
    with UvicornThread(ConsulDouble(consul_state).app()) as server:
        yield server


def consul_settings(url: str, **overrides: object) -> ConsulSettings:
    fields: dict[str, object] = {
        "address": url,
        "deregister_critical_after_s": DEREGISTER_AFTER_S,
        "request_timeout_s": 2.0,
        "min_watch_interval_s": 0.05,
    }
    fields.update(overrides)
    return ConsulSettings.model_validate(fields)


@pytest.fixture(params=["embedded", "consul"])
async def registry(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Registry]:
    reg: Registry
    if request.param == "embedded":
        reg = EmbeddedRegistry(tmp_path / "registry.db", deregister_after_s=DEREGISTER_AFTER_S)
    else:
        server: UvicornThread = request.getfixturevalue("consul_server")
        reg = ConsulRegistry(consul_settings(server.url), environ={})
    try:
        yield reg
    finally:
        await reg.aclose()
