"""Service tokens and TLS on an edge agent.

In process, over a scripted engine: 401 in the OpenAI shape without the
token, served with it, open probes, rotation. As a subprocess (the real CLI
on the bundled model): HTTPS with a certificate from a private CA made in the
test, reached through the router, and SIGHUP swapping tokens and certificate
while a stream is in flight.
"""

from __future__ import annotations

import json
import signal
import socket
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import httpx
import pytest
from cryptography import x509

from edge_agent.settings import EdgeSettings
from geo_router.app import create_app as create_router
from hybrid_llm.local.servers import (
    UvicornThread,
    free_port,
    service_process,
    wait_ready,
    wait_until,
)
from model_sync.signing import generate_keypair, key_id, parse_public_key
from servekit.service_auth import ServiceAuthSettings
from tests.edge_agent.conftest import MODEL, in_process, scripted_app
from tests.geo_router.conftest import KEY, router_settings, upstream
from tests.support.pki import PrivateCA

CHAT = {"model": MODEL, "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2}


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


@pytest.fixture
async def edge(
    scripted_settings: Callable[..., EdgeSettings],
) -> AsyncIterator[tuple[httpx.AsyncClient, Any]]:
    settings = scripted_settings(instance__id="edge-auth", server__auth={"tokens": ["svc-current"]})
    app = scripted_app(settings)
    async with in_process(app) as c:
        yield c, app


@pytest.mark.anyio
async def test_an_edge_rejects_calls_without_its_token_and_serves_them_with_it(
    edge: tuple[httpx.AsyncClient, Any],
) -> None:
    c, _ = edge
    for path, method in (("/v1/chat/completions", "POST"), ("/v1/completions", "POST"),
                         ("/v1/models", "GET"), ("/load", "GET")):  # fmt: skip
        r = await c.request(method, path, json=CHAT)
        assert r.status_code == 401, (path, r.text)
        assert set(r.json()["error"]) == {"message", "type", "param", "code"}
        assert r.json()["error"]["type"] == "authentication_error"
        wrong = await c.request(method, path, json=CHAT, headers=bearer("svc-guess"))
        assert wrong.status_code == 401
    ok = await c.post("/v1/chat/completions", json=CHAT, headers=bearer("svc-current"))
    assert ok.status_code == 200, ok.text
    assert ok.json()["object"] == "chat.completion"
    load = await c.get("/load", headers=bearer("svc-current"))
    assert load.status_code == 200
    assert load.json()["model"] == MODEL
    for probe in ("/health", "/ready", "/metrics"):  # supervisors and Prometheus
        assert (await c.get(probe)).status_code == 200


@pytest.mark.anyio
async def test_a_rotated_token_works_while_the_old_one_is_still_listed(
    edge: tuple[httpx.AsyncClient, Any],
) -> None:
    c, app = edge
    gate = app.state.token_gate
    try:
        gate.update(ServiceAuthSettings(tokens=["svc-next", "svc-current"]))  # type: ignore[list-item]
        for token in ("svc-next", "svc-current"):
            r = await c.post("/v1/chat/completions", json=CHAT, headers=bearer(token))
            assert r.status_code == 200, (token, r.text)
        gate.update(ServiceAuthSettings(tokens=["svc-next"]))  # type: ignore[list-item]
        old = await c.post("/v1/chat/completions", json=CHAT, headers=bearer("svc-current"))
        assert old.status_code == 401
    finally:
        gate.update(ServiceAuthSettings(tokens=["svc-current"]))  # type: ignore[list-item]


def small_engine(model_path: Path) -> dict[str, Any]:
    """The real GGUF model as an edge's ``engine:`` block, its smallest context."""
    return {
        "model_path": str(model_path),
        "model_name": MODEL,
        "n_ctx": 512,
        "n_threads": 2,
        "warmup_tokens": 1,
    }


def _served_serial(port: int, ca: PrivateCA) -> int:
    ctx = ca.client_context()
    with (
        socket.create_connection(("127.0.0.1", port), timeout=10) as raw,
        ctx.wrap_socket(raw, server_hostname="127.0.0.1") as tls,
    ):
        der = tls.getpeercert(binary_form=True)
    assert der is not None
    return x509.load_der_x509_certificate(der).serial_number


@pytest.mark.model
@pytest.mark.slow
def test_a_tls_edge_behind_a_private_ca_through_the_router_and_sighup_rotation(
    model_path: Path, tmp_path: Path
) -> None:
    ca = PrivateCA(tmp_path / "pki")
    first, second = ca.issue("127.0.0.1"), ca.issue("127.0.0.1")
    live_cert, live_key = tmp_path / "edge.pem", tmp_path / "edge.key"
    live_cert.write_bytes(first.cert_file.read_bytes())
    live_key.write_bytes(first.key_file.read_bytes())
    tokens = tmp_path / "tokens"
    tokens.write_text("svc-old\nsvc-new\n")  # mid-rotation: both accepted
    port = free_port()
    cfg = tmp_path / "edge.yaml"
    cfg.write_text(
        json.dumps(
            {
                "server": {
                    "host": "127.0.0.1",
                    "port": port,
                    "log_level": "warning",
                    "auth": {"tokens_file": str(tokens)},
                    "tls": {"cert_file": str(live_cert), "key_file": str(live_key)},
                },
                "instance": {"id": "edge-tls", "region": "east"},
                "engine": small_engine(model_path),
            }
        )
    )
    url = f"https://127.0.0.1:{port}"
    verify = ca.client_context()
    with service_process(["edge_agent", "serve", "--config", str(cfg)], url, verify=verify) as p:
        with httpx.Client(verify=verify, timeout=60) as direct:
            assert direct.post(url + "/v1/chat/completions", json=CHAT).status_code == 401
            with pytest.raises(httpx.ConnectError):  # the system store does not know our CA
                httpx.get(url + "/ready", timeout=5)

            peers = {"edge": {"token": "svc-old", "ca_file": str(ca.ca_file), "require_tls": True}}
            settings = router_settings(
                [upstream(url, id="edge-tls", model=MODEL)],
                peers=peers,
                routing={"ttft_deadline_s": 30.0},
            )
            with UvicornThread(create_router(settings)) as router:
                wait_ready(router.url, timeout=30)
                body = {**CHAT, "model": "edge", "max_tokens": 4}
                r = httpx.post(
                    router.url + "/v1/chat/completions",
                    json=body,
                    headers={"Authorization": f"Bearer {KEY}"},
                    timeout=60,
                )
            assert r.status_code == 200, r.text
            assert r.headers["x-route-instance"] == "edge-tls"

            # SIGHUP with renewed files: a stream already open keeps going; new
            # handshakes get the new certificate; the old token is gone.
            assert _served_serial(port, ca) == _serial_of(first.cert_file)
            long = {**CHAT, "max_tokens": 48, "stream": True}
            with direct.stream(
                "POST", url + "/v1/chat/completions", json=long, headers=bearer("svc-new")
            ) as stream:
                assert stream.status_code == 200
                lines = stream.iter_lines()
                assert next(line for line in lines if line.startswith("data: "))
                live_cert.write_bytes(second.cert_file.read_bytes())
                live_key.write_bytes(second.key_file.read_bytes())
                tokens.write_text("svc-new\n")
                p.send_signal(signal.SIGHUP)
                rest = [line for line in lines if line.startswith("data: ")]
            assert rest[-1] == "data: [DONE]"
            assert _wait_for(lambda: _served_serial(port, ca) == _serial_of(second.cert_file))
            assert direct.get(url + "/load", headers=bearer("svc-old")).status_code == 401
            assert direct.get(url + "/load", headers=bearer("svc-new")).status_code == 200
        assert p.poll() is None  # SIGHUP reloaded, it did not stop the agent


def _serial_of(cert_file: Path) -> int:
    return x509.load_pem_x509_certificate(cert_file.read_bytes()).serial_number


def _wait_for(check: Callable[[], bool], timeout: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if check():
            return True
        time.sleep(0.1)
    return False


@pytest.mark.anyio
async def test_sighup_reloads_the_keys_version_records_are_checked_against(
    scripted_settings: Callable[..., EdgeSettings], tmp_path: Path
) -> None:
    """The edge's reload hook (what SIGHUP calls with the re-read file) hands the
    reconciler the trusted keys it lists now; they were read only at start."""
    publics = [
        generate_keypair(tmp_path / "keys", name)[1].read_text().strip()
        for name in ("current", "next")
    ]
    ids = [key_id(parse_public_key(text)) for text in publics]

    def settings(trusted: list[str]) -> EdgeSettings:
        return scripted_settings(
            instance__id="edge-keys",
            registry={"backend": "embedded", "embedded": {"path": str(tmp_path / "reg.db")}},
            model_sync={"model_dir": str(tmp_path / "models"), "trusted_keys": trusted},
        )

    app = scripted_app(settings(publics[:1]))
    async with in_process(app):
        reconciler = app.state.agent.reconciler
        assert set(reconciler.verifier.keys) == {ids[0]}
        app.state.hooks.reload(settings(publics))
        assert set(reconciler.verifier.keys) == set(ids)
        app.state.hooks.reload(settings(publics[1:]))
        assert set(reconciler.verifier.keys) == {ids[1]}


@pytest.mark.slow
def test_sighup_rereads_the_trusted_keys_file_of_a_running_edge(
    model_path: Path, tmp_path: Path
) -> None:
    """The real ``edge-agent serve``: keys added to and removed from its trusted keys file
    are in force after SIGHUP, and the log says which, by key id."""
    publics = [
        generate_keypair(tmp_path / "keys", name)[1].read_text().strip()
        for name in ("current", "next")
    ]
    ids = [key_id(parse_public_key(text)) for text in publics]
    trusted = tmp_path / "trusted.pub"
    trusted.write_text(publics[0] + "\n")
    port = free_port()
    cfg = tmp_path / "edge.yaml"
    cfg.write_text(
        json.dumps(
            {
                "server": {"host": "127.0.0.1", "port": port, "log_level": "warning"},
                "instance": {"id": "edge-keys", "region": "east"},
                "engine": small_engine(model_path),
                "registry": {"backend": "embedded", "embedded": {"path": str(tmp_path / "r.db")}},
                "model_sync": {
                    "model_dir": str(tmp_path / "models"),
                    "trusted_keys_file": str(trusted),
                },
            }
        )
    )
    log = tmp_path / "edge.log"
    url = f"http://127.0.0.1:{port}"
    with (
        log.open("wb") as out,
        service_process(["edge_agent", "serve", "--config", str(cfg)], url, stderr=out) as p,
    ):
        trusted.write_text("\n".join(publics) + "\n")
        p.send_signal(signal.SIGHUP)
        added = f"trusted keys reloaded: added {ids[1]}, removed none"
        wait_until(lambda: added in log.read_text(), 10, "the reload's log line")
        trusted.write_text(publics[1] + "\n")
        p.send_signal(signal.SIGHUP)
        removed = f"trusted keys reloaded: added none, removed {ids[0]}"
        wait_until(lambda: removed in log.read_text(), 10, "the second reload's log line")
    assert publics[0] not in log.read_text()  # ids name the keys, not the keys themselves
