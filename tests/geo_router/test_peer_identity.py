"""The router checks that an upstream's certificate names its role (``peers.*.identity``).

Every certificate here comes from one fleet CA, as a stolen edge's would: only
the names in it differ. Upstreams are real HTTPS servers; a recording relay in
front of one shows what reached the wire.
"""

from __future__ import annotations

import logging
import time
from pathlib import Path

import anyio
import httpx
import pytest
from asgi_lifespan import LifespanManager

from geo_router.app import create_app
from hybrid_llm.local.servers import UvicornThread, wait_until
from servekit.engine.protocol import LoadReport
from servekit.registry import RegistrySettings, open_registry
from servekit.registry.protocol import InstanceInfo, InstanceState
from tests.geo_router.conftest import router_settings, upstream
from tests.geo_router.fake_upstream import Behavior, build_app
from tests.geo_router.test_tls import (
    AUTH,
    BODY,
    TOKEN,
    https_state,
    router,
    stream_text,
    tls_upstream,
)
from tests.support.pki import PrivateCA
from tests.support.tcp_recorder import RecordingRelay

EDGE_NAME = "edge.hybrid-llm.internal"
CENTER_NAME = "center.hybrid-llm.internal"


def peers(ca: PrivateCA, identity: str) -> dict[str, dict[str, object]]:
    return {"default": {"token": TOKEN, "ca_file": str(ca.ca_file), "identity": identity}}


def test_an_edge_certificate_does_not_serve_as_the_center(pki: dict[str, PrivateCA]) -> None:
    """A registration claiming ``tier: center`` whose certificate names only the edge
    role fails the handshake: 503 naming the expected name, nothing sent."""
    fleet = pki["fleet"]
    stolen = Behavior(words=4)
    with (
        tls_upstream(fleet, stolen, names=("127.0.0.1", EDGE_NAME)) as up,
        RecordingRelay(up.port) as relay,
    ):
        states = [https_state(relay.port, "center-1", "center")]
        with router(router_settings([], peers=peers(fleet, "tier")), states) as url:
            r, _ = stream_text(url)
    assert r.status_code == 503, r.text
    message = r.json()["error"]["message"]
    assert "TLS certificate verification failed" in message, message
    assert CENTER_NAME in message, message
    assert len(relay.first_bytes) >= 1
    assert relay.all_tls(), relay.first_bytes
    assert stolen.seen == []  # not a byte of the request, token included


def test_a_certificate_naming_the_role_is_served_without_naming_the_address(
    pki: dict[str, PrivateCA],
) -> None:
    fleet = pki["fleet"]
    seen = Behavior(words=3)
    with tls_upstream(fleet, seen, names=(CENTER_NAME,)) as up:
        states = [https_state(up.port, "center-1", "center")]
        with router(router_settings([], peers=peers(fleet, "tier")), states) as url:
            r, text = stream_text(url)
    assert (r.status_code, text) == (200, "w0 w1 w2"), r.text
    assert seen.seen[-1]["headers"]["authorization"] == f"Bearer {TOKEN}"


def test_instance_identity_tells_one_edge_from_another(pki: dict[str, PrivateCA]) -> None:
    """``identity: instance``: edge-a's certificate opens edge-a only; the router falls
    over to the edge whose certificate names it."""
    fleet = pki["fleet"]
    impostor, real = Behavior(words=2), Behavior(words=2)
    with (
        tls_upstream(fleet, impostor, names=("edge-a.edge.hybrid-llm.internal",)) as a_cert,
        tls_upstream(fleet, real, names=("edge-b.edge.hybrid-llm.internal",)) as b_cert,
    ):
        # edge-b's registration points at a server holding edge-a's certificate.
        states = [https_state(a_cert.port, "edge-b"), https_state(b_cert.port, "edge-b2")]
        with router(router_settings([], peers=peers(fleet, "instance")), states) as url:
            refused = [stream_text(url)[0] for _ in range(2)]
        states = [https_state(b_cert.port, "edge-b")]
        with router(router_settings([], peers=peers(fleet, "instance")), states) as url:
            served, text = stream_text(url)
    for r in refused:  # edge-b2's certificate names edge-b: nobody is left
        assert r.status_code == 503, r.text
    assert impostor.seen == []
    assert (served.status_code, text) == (200, "w0 w1")


def test_a_role_is_never_checked_over_plain_http(pki: dict[str, PrivateCA]) -> None:
    """With a role to check, an instance that registered ``http`` is refused before a
    connection: TLS is the only place its identity could be proven."""
    plain = Behavior()
    with UvicornThread(build_app(plain)) as up, RecordingRelay(up.port) as relay:
        info = InstanceInfo("center-1", "center", "east", "127.0.0.1", relay.port, "fake-model")
        state = InstanceState(info, LoadReport(ready=True, capacity=4), True, time.time())
        with router(router_settings([], peers=peers(pki["fleet"], "tier")), [state]) as url:
            r, _ = stream_text(url)
    assert r.status_code == 503, r.text
    assert "plain text" in r.json()["error"]["message"]
    assert relay.first_bytes == []
    assert plain.seen == []


def test_a_polled_upstream_with_the_wrong_role_is_left_out_and_logged_once(
    pki: dict[str, PrivateCA], caplog: pytest.LogCaptureFixture
) -> None:
    """A static center whose certificate names the edge: its probes fail the handshake,
    the router says why once, and never routes to it."""
    fleet = pki["fleet"]
    stolen = Behavior(words=2)
    caplog.set_level(logging.WARNING)
    with tls_upstream(fleet, stolen, names=("127.0.0.1", EDGE_NAME)) as up:
        entry = upstream(up.url, tier="center", region="center", id="center-1")
        settings = router_settings([entry], peers=peers(fleet, "tier"), poll_interval_s=0.05)
        with router(settings) as url:

            def warned() -> list[str]:
                return [r.getMessage() for r in caplog.records if CENTER_NAME in r.getMessage()]

            wait_until(lambda: len(warned()) >= 1, 10, "a warning naming the expected name")
            time.sleep(0.5)  # ten more probe rounds
            r, _ = stream_text(url)
            ready = httpx.get(url + "/ready")
    assert len(warned()) == 1, warned()
    assert "TLS certificate verification failed" in warned()[0]
    assert r.status_code == 503, r.text
    assert ready.status_code == 503
    assert stolen.seen == []


@pytest.mark.anyio
async def test_a_registration_claiming_the_center_with_an_edge_certificate_is_not_used(
    pki: dict[str, PrivateCA], tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The attack itself: a stolen edge registers itself as a center in the registry.
    Its /load polls fail the handshake, the router says so once and routes to the
    real center only."""
    fleet = pki["fleet"]
    stolen, center = Behavior(words=2), Behavior(words=2)
    caplog.set_level(logging.WARNING)
    reg = RegistrySettings.model_validate(
        {"backend": "embedded", "embedded": {"path": str(tmp_path / "registry.db")}}
    )
    registry = await open_registry(reg)
    try:
        with (
            tls_upstream(fleet, stolen, names=("127.0.0.1", EDGE_NAME)) as fake,
            tls_upstream(fleet, center, names=("127.0.0.1", CENTER_NAME)) as real,
        ):
            for iid, port in (("center-0", fake.port), ("center-1", real.port)):
                info = InstanceInfo(
                    iid, "center", "center", "127.0.0.1", port, "m", meta={"scheme": "https"}
                )
                await registry.register(info, ttl_s=60)
                await registry.heartbeat(iid, LoadReport(ready=True, capacity=4, model="m"))
            settings = router_settings(
                [],
                registry=reg.model_dump(mode="json"),
                peers=peers(fleet, "tier"),
                poll_interval_s=0.05,
            )
            app = create_app(settings)
            async with LifespanManager(app) as manager:
                transport = httpx.ASGITransport(app=manager.app)
                async with httpx.AsyncClient(transport=transport, base_url="http://r") as c:
                    for _ in range(100):  # two failed polls mark it unreachable
                        if any("center-0" in r.getMessage() for r in caplog.records):
                            break
                        await anyio.sleep(0.05)
                    await anyio.sleep(0.3)  # more polls: still one warning
                    answers = [
                        await c.post("/v1/chat/completions", json=BODY, headers=AUTH)
                        for _ in range(4)
                    ]
    finally:
        await registry.aclose()
    for r in answers:
        assert r.status_code == 200, r.text
        assert r.headers["x-route-instance"] == "center-1"
    warned = [r.getMessage() for r in caplog.records if "center-0" in r.getMessage()]
    assert len(warned) == 1, warned
    assert f"certificate is not valid for '{CENTER_NAME}'" in warned[0]
    assert stolen.seen == []


def test_a_static_upstream_without_a_nameable_id_fails_at_start(pki: dict[str, PrivateCA]) -> None:
    entry = upstream("https://10.0.0.7:8101", id="edge_a")
    with pytest.raises(ValueError, match="instance id 'edge_a' is not a DNS label"):
        router_settings([entry], peers=peers(pki["fleet"], "instance"))
    with pytest.raises(ValueError, match="can only be checked over TLS"):
        router_settings([upstream("http://10.0.0.7:8101")], peers=peers(pki["fleet"], "tier"))
    router_settings(
        [upstream("https://10.0.0.7:8101", id="edge-a")], peers=peers(pki["fleet"], "instance")
    )
