"""Where the router sends an instance's requests: its registered origin, always."""

from __future__ import annotations

import pytest

from geo_router.scoring import instance_url
from servekit.engine.protocol import LoadReport
from servekit.registry.protocol import InstanceInfo, InstanceState
from servekit.registry.settings import StaticEntry
from servekit.registry.static import entry_info


def state(info: InstanceInfo) -> InstanceState:
    return InstanceState(info=info, load=LoadReport(), healthy=True, last_heartbeat=0.0)


def registered(meta: dict[str, str]) -> InstanceState:
    return state(InstanceInfo("e1", "edge", "east", "10.0.0.7", 8101, "m", meta=meta))


@pytest.mark.parametrize(
    "given",
    [
        "http://10.0.0.8:8101",  # another host
        "http://10.0.0.7:9000",  # another port on the same host
        "https://10.0.0.7:8101",  # a scheme it did not register
        "http://user:pw@10.0.0.7:8101",  # credentials smuggled in
        "http://10.0.0.7:notaport",
    ],
)
def test_meta_url_naming_another_origin_is_ignored(given: str) -> None:
    assert instance_url(registered({"url": given})) == "http://10.0.0.7:8101"


def test_meta_url_on_the_registered_origin_keeps_its_path() -> None:
    assert instance_url(registered({"url": "http://10.0.0.7:8101/v"})) == "http://10.0.0.7:8101/v"
    tls = registered({"url": "https://10.0.0.7:8101", "scheme": "https"})
    assert instance_url(tls) == "https://10.0.0.7:8101"


@pytest.mark.parametrize(
    "url", ["https://edge.example:8443/prefix", "https://edge.example", "http://127.0.0.1:8101"]
)
def test_a_static_upstream_is_reached_at_its_configured_url(url: str) -> None:
    entry = StaticEntry.model_validate({"url": url, "tier": "edge", "region": "east", "model": "m"})
    assert instance_url(state(entry_info(entry))) == url
