"""What a hostile record or a careless artifact server could do, refused: local sources
outside local_roots, redirects to other hosts, a tampered installed directory, dotfiles,
a file behind an open path, and an open server on a public address."""

from __future__ import annotations

import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import RedirectResponse, Response
from starlette.routing import Mount, Route

from hybrid_llm.local.servers import REPO, UvicornThread, free_port, service_process
from model_sync.agent import ReconcilerSettings
from model_sync.artifacts import create_app
from model_sync.download import Downloader, SourceUnavailable
from model_sync.manifest import INSTALLED_MANIFEST
from model_sync.modeldir import ModelDir
from servekit.service_auth import ServiceAuthSettings, TokenGate, is_loopback
from tests.model_sync.helpers import make_artifact, record_for
from tests.model_sync.test_modeldirs import FILES, dir_record, make_model_dir

pytestmark = pytest.mark.anyio


async def test_local_sources_only_from_local_roots(tmp_path: Path) -> None:
    allowed = tmp_path / "published"
    data, _ = make_artifact(allowed / "m.gguf", 10_000)
    secret = tmp_path / "home" / "credentials"
    secret.parent.mkdir()
    secret.write_bytes(data)  # same bytes: only where it lies makes it wrong
    (allowed / "link.gguf").symlink_to(secret)
    models = ModelDir(tmp_path / "models")
    dl = Downloader(models, local_roots=(allowed,))
    for uri in (str(secret), secret.as_uri(), str(allowed / "link.gguf")):
        with pytest.raises(SourceUnavailable, match="local_roots"):
            await dl.fetch(record_for("stolen", "v1", uri, data))
    assert not (models.root / "stolen" / "v1").exists()
    path = await dl.fetch(record_for("ok", "v1", (allowed / "m.gguf").as_uri(), data))
    assert path.read_bytes() == data
    # The edge agent's setting: the checkout's models/ unless configured.
    assert ReconcilerSettings().local_roots == [Path("models")]


def _redirector(to: str) -> Starlette:
    async def moved(request: Request) -> Response:
        return RedirectResponse(to + request.url.path, status_code=302)

    return Starlette(routes=[Route("/{path:path}", moved)])


async def test_redirects_only_within_the_same_host(tmp_path: Path) -> None:
    served = tmp_path / "served"
    data, _ = make_artifact(served / "m.gguf", 10_000)
    models = ModelDir(tmp_path / "models")
    with UvicornThread(create_app(served)) as files:
        # 127.0.0.1 and localhost are different hosts to a client, as they should be.
        other = files.url.replace("127.0.0.1", "localhost")
        with UvicornThread(_redirector(other)) as bouncer:
            rec = record_for("tiny", "v1", f"{bouncer.url}/m.gguf", data)
            with pytest.raises(SourceUnavailable, match="another host"):
                await Downloader(models, attempts=1).fetch(rec)
        same = Starlette(
            routes=[
                Route(
                    "/old/{path:path}", lambda r: RedirectResponse(f"/new/{r.path_params['path']}")
                ),
                Mount("/new", create_app(served)),
            ]
        )
        with UvicornThread(same) as server:
            rec = record_for("tiny", "v2", f"{server.url}/old/m.gguf", data)
            assert (await Downloader(models).fetch(rec)).read_bytes() == data


async def test_an_installed_directory_is_hashed_again_not_trusted_by_its_marker(
    tmp_path: Path,
) -> None:
    source = make_model_dir(tmp_path / "served" / "SmolLM2")
    rec = dir_record(source, str(source))
    models = ModelDir(tmp_path / "models")
    path = await Downloader(models).fetch(rec)
    assert (path / INSTALLED_MANIFEST).is_file()
    (path / "config.json").write_bytes(b'{"planted": true}')  # the marker stays
    again = await Downloader(models).fetch(rec)
    assert again == path
    assert (path / "config.json").read_bytes() == FILES["config.json"]
    assert not [p for p in path.parent.iterdir() if p.name.startswith(".replaced-")]


def test_the_artifact_server_hides_dotfiles_and_open_paths(tmp_path: Path) -> None:
    root = tmp_path / "served"
    make_artifact(root / "m.gguf", 1000)
    (root / ".git").mkdir()
    (root / ".git" / "config").write_text("[remote] url = https://user:hf_secret@hub")
    (root / "sub").mkdir()
    (root / "sub" / ".env").write_text("TOKEN=hf_secret")
    (root / "metrics").write_text("hf_secret")
    gate = TokenGate(ServiceAuthSettings.model_validate({"tokens": ["t0ken"]}))
    with UvicornThread(create_app(root, gate)) as server:
        auth = {"Authorization": "Bearer t0ken"}
        assert httpx.get(f"{server.url}/m.gguf", headers=auth).status_code == 200
        for target in ("/.git/config", "/sub/.env", "/metrics"):
            for headers in (auth, {}):
                r = httpx.get(server.url + target, headers=headers)
                assert "hf_secret" not in r.text, (target, headers)
                assert r.status_code in (401, 404)


def test_serve_artifacts_refuses_a_public_address_without_tokens(tmp_path: Path) -> None:
    base = [sys.executable, "-m", "model_sync", "serve-artifacts", str(tmp_path)]
    args = [*base, "--host", "0.0.0.0", "--port", str(free_port())]
    done = subprocess.run(args, cwd=REPO, capture_output=True, text=True, timeout=60)
    assert done.returncode == 2
    assert "--allow-unauthenticated" in done.stderr


@pytest.mark.parametrize(
    ("host", "loopback"),
    [("127.0.0.1", True), ("::1", True), ("localhost", True), ("0.0.0.0", False),
     ("10.0.0.5", False), ("edge.example", False)],
)  # fmt: skip
def test_is_loopback(host: str, loopback: bool) -> None:
    assert is_loopback(host) is loopback


def test_a_reload_that_removes_every_token_is_refused(tmp_path: Path) -> None:
    (tmp_path / "store").mkdir()
    (tmp_path / "store" / "m.gguf").write_bytes(b"GGUF")
    config = tmp_path / "model-sync.yaml"
    config.write_text("artifact_server: {auth: {tokens: [art-1]}}\n")
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    args = ["model_sync", "--config", str(config), "serve-artifacts", str(tmp_path / "store")]
    with service_process([*args, "--port", str(port)], url, ready_timeout=60) as proc:
        assert httpx.get(url + "/m.gguf").status_code == 401
        config.write_text("artifact_server: {}\n")  # every token gone: it would open the store
        proc.send_signal(signal.SIGHUP)
        time.sleep(1.0)
        assert httpx.get(url + "/m.gguf").status_code == 401
        ok = httpx.get(url + "/m.gguf", headers={"Authorization": "Bearer art-1"})
        assert ok.status_code == 200
        assert proc.poll() is None


def test_serve_artifacts_has_the_services_connection_limits(tmp_path: Path) -> None:
    # A 200 kB request head: accepted without end before (the parser takes any size).
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    args = ["model_sync", "serve-artifacts", str(tmp_path), "--port", str(port)]
    with (
        service_process(args, url, ready_timeout=60),
        socket.create_connection(("127.0.0.1", port), timeout=10) as sock,
    ):
        sock.sendall(b"GET /health HTTP/1.1\r\nhost: a\r\nx-pad: " + b"a" * 200_000)
        assert sock.recv(1024).startswith(b"HTTP/1.1 431")
