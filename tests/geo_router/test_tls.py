"""The router's upstream hop over TLS with a private CA, a service token and mTLS.

Upstreams are real HTTPS servers (the fake upstream under uvicorn with a
certificate made in the test); a recording relay in front of a server shows
what the router put on the wire.
"""

from __future__ import annotations

import json
import ssl
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx

from geo_router.app import create_app
from hybrid_llm.local.servers import UvicornThread, wait_ready
from servekit.engine.protocol import LoadReport
from servekit.http_protocol import HeadWithBodyProtocol
from servekit.registry.protocol import InstanceInfo, InstanceState
from tests.geo_router.conftest import KEY, router_settings, upstream
from tests.geo_router.fake_upstream import Behavior, build_app
from tests.support.pki import PrivateCA
from tests.support.tcp_recorder import RecordingRelay

AUTH = {"Authorization": f"Bearer {KEY}"}
TOKEN = "svc-router-to-edges"
BODY = {"model": "auto", "messages": [{"role": "user", "content": "hi"}], "stream": True}


@contextmanager
def tls_upstream(
    ca: PrivateCA,
    behavior: Behavior,
    client_ca: PrivateCA | None = None,
    names: tuple[str, ...] = ("127.0.0.1",),
) -> Iterator[UvicornThread]:
    """``behavior`` served over HTTPS with a certificate from ``ca`` for ``names``."""
    issued = ca.issue(*names)
    extra: dict[str, Any] = {
        "ssl_certfile": str(issued.cert_file),
        "ssl_keyfile": str(issued.key_file),
        "loop": "asyncio",
    }
    if client_ca is not None:
        extra |= {"ssl_ca_certs": str(client_ca.ca_file), "ssl_cert_reqs": ssl.CERT_REQUIRED}
    with UvicornThread(build_app(behavior), **extra) as server:
        yield server


def https_state(port: int, iid: str, tier: str = "edge") -> InstanceState:
    info = InstanceInfo(
        iid,
        tier,
        "east",
        "127.0.0.1",
        port,
        "fake-model",
        meta={"scheme": "https"},  # type: ignore[arg-type]
    )
    return InstanceState(info, LoadReport(ready=True, capacity=4), True, time.time())


@contextmanager
def router(settings: Any, states: list[InstanceState] | None = None) -> Iterator[str]:
    app = create_app(settings, candidates=(lambda: states) if states is not None else None)
    with UvicornThread(app, http=HeadWithBodyProtocol) as server:
        yield server.url


def stream_text(url: str) -> tuple[httpx.Response, str]:
    with httpx.Client(timeout=20) as c:
        r = c.post(url + "/v1/chat/completions", json=BODY, headers=AUTH)
    text = "".join(
        e["choices"][0]["delta"].get("content") or ""
        for line in r.text.splitlines()
        if line.startswith("data: {")
        for e in [json.loads(line[6:])]
        if e.get("choices")
    )
    return r, text


def test_a_tls_upstream_behind_a_private_ca_is_reached_with_the_token(
    pki: dict[str, PrivateCA],
) -> None:
    fleet = pki["fleet"]
    seen = Behavior(words=4)
    with tls_upstream(fleet, seen) as up:
        assert up.url.startswith("https://")
        peers = {"default": {"token": TOKEN, "ca_file": str(fleet.ca_file), "require_tls": True}}
        settings = router_settings([upstream(up.url, id="edge-tls")], peers=peers)
        with router(settings) as url:  # static upstream: /ready and /load polled over TLS
            wait_ready(url, timeout=10)
            r, text = stream_text(url)
    assert r.status_code == 200, r.text
    assert r.headers["x-route-instance"] == "edge-tls"
    assert text == "w0 w1 w2 w3"
    upstream_headers = seen.seen[-1]["headers"]
    assert upstream_headers["authorization"] == f"Bearer {TOKEN}"  # the service token...
    assert KEY not in json.dumps(seen.seen)  # ...never the client's key


def test_an_upstream_with_a_certificate_from_another_ca_is_refused_never_in_clear_text(
    pki: dict[str, PrivateCA],
) -> None:
    impostor = Behavior(words=4)
    with tls_upstream(pki["other"], impostor) as up, RecordingRelay(up.port) as relay:
        peers = {"default": {"token": TOKEN, "ca_file": str(pki["fleet"].ca_file)}}
        settings = router_settings([], peers=peers, routing={"breaker": {"failures": 10}})
        with router(settings, [https_state(relay.port, "edge-impostor")]) as url:
            responses = [stream_text(url)[0] for _ in range(3)]
    for r in responses:
        assert r.status_code == 503, r.text
        message = r.json()["error"]["message"]
        assert "TLS certificate verification failed" in message, message
        assert "unable to get local issuer certificate" in message, message
    # Three attempts, each a TLS handshake, and not one byte of HTTP in clear text:
    assert len(relay.first_bytes) >= 3
    assert relay.all_tls(), relay.first_bytes
    assert impostor.seen == []  # nothing reached the application, token included


def test_a_refused_certificate_fails_over_to_the_next_candidate(
    pki: dict[str, PrivateCA],
) -> None:
    fleet = pki["fleet"]
    with (
        tls_upstream(pki["other"], Behavior()) as bad,
        tls_upstream(fleet, Behavior(words=3)) as good,
    ):
        peers = {"default": {"token": TOKEN, "ca_file": str(fleet.ca_file)}}
        states = [https_state(bad.port, "edge-bad"), https_state(good.port, "center", "center")]
        with router(router_settings([], peers=peers), states) as url:
            r, text = stream_text(url)
            metrics = httpx.get(url + "/metrics").text
    assert r.status_code == 200, r.text
    assert (r.headers["x-route-instance"], text) == ("center", "w0 w1 w2")
    assert 'router_fallbacks_total{cause="unavailable",tier="edge"} 1.0' in metrics


def test_mutual_tls_the_router_presents_its_client_certificate(
    pki: dict[str, PrivateCA], tmp_path: Path
) -> None:
    fleet = pki["fleet"]
    client = fleet.issue("geo-router")
    with tls_upstream(fleet, Behavior(words=2), client_ca=fleet) as up:
        states = [https_state(up.port, "edge-mtls")]
        without = {"default": {"ca_file": str(fleet.ca_file)}}
        with router(router_settings([], peers=without), states) as url:
            refused, _ = stream_text(url)
        with_cert = {
            "default": {
                "ca_file": str(fleet.ca_file),
                "cert_file": str(client.cert_file),
                "key_file": str(client.key_file),
            }
        }
        with router(router_settings([], peers=with_cert), states) as url:
            served, text = stream_text(url)
    # TLS 1.3 checks the client certificate after the handshake: the server hangs up
    # once the request is sent, a broken exchange (retryable), not a refused connect.
    assert refused.status_code in (502, 503), refused.text
    assert (served.status_code, text) == (200, "w0 w1")


def test_require_tls_refuses_a_plain_http_upstream_before_sending_anything() -> None:
    plain = Behavior()
    with UvicornThread(build_app(plain)) as up, RecordingRelay(up.port) as relay:
        info = InstanceInfo("edge-plain", "edge", "east", "127.0.0.1", relay.port, "fake-model")
        state = InstanceState(info, LoadReport(ready=True, capacity=4), True, time.time())
        peers = {"edge": {"token": TOKEN, "require_tls": True}}
        with router(router_settings([], peers=peers), [state]) as url:
            r, _ = stream_text(url)
    assert r.status_code == 503
    assert "plain text" in r.json()["error"]["message"]
    assert relay.first_bytes == []  # not even a connection
    assert plain.seen == []
