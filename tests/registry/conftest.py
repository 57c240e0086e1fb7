"""Fixtures: each registry backend, fresh per test, against real storage.

``registry`` is parametrized over the embedded SQLite store and the Consul
backend talking to :mod:`tests.registry.consul_double` on a real socket, so
one contract suite runs against both.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

from servekit.registry.consul import ConsulRegistry
from servekit.registry.embedded import EmbeddedRegistry
from servekit.registry.protocol import Registry
from servekit.registry.settings import ConsulSettings
from tests.registry.consul_double import ConsulDouble, ConsulState
from tests.support.servers import UvicornThread

# Short enough for fast tests, long enough for a loaded 2-core box.
DEREGISTER_AFTER_S = 1.5


@pytest.fixture
def consul_state() -> ConsulState:
    return ConsulState(deregister_floor_s=0.0, session_ttl_min_s=0.5)


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
