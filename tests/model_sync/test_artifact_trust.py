"""Artifacts behind a token: the server refuses without it, nodes download with it, and
no credential lands in version records, history or node errors."""

from __future__ import annotations

import json
from pathlib import Path

import httpx
import pytest

from hybrid_llm.local.servers import UvicornThread
from model_sync.artifacts import create_app
from model_sync.cli import main
from model_sync.download import Downloader, SourceUnavailable
from model_sync.modeldir import ModelDir
from model_sync.records import ActualState, ArtifactRecord, HistoryEntry
from servekit.peers import PeerSettings
from servekit.service_auth import ServiceAuthSettings, TokenGate
from tests.model_sync.helpers import make_artifact, record_for
from tests.support.pki import PrivateCA

TOKEN = "svc-artifact-reader"


@pytest.fixture
def artifacts(tmp_path: Path) -> tuple[Path, bytes]:
    data, _ = make_artifact(tmp_path / "store" / "tiny-v2.gguf", 300_000)
    return tmp_path / "store", data


def protected(root: Path) -> UvicornThread:
    gate = TokenGate(ServiceAuthSettings.model_validate({"tokens": [TOKEN]}))
    return UvicornThread(create_app(root, gate))


def test_the_artifact_server_wants_the_token_for_files_not_for_probes(
    artifacts: tuple[Path, bytes],
) -> None:
    root, data = artifacts
    with protected(root) as server:
        refused = httpx.get(server.url + "/tiny-v2.gguf")
        assert refused.status_code == 401
        assert refused.json()["error"]["type"] == "authentication_error"
        assert httpx.get(server.url + "/health").status_code == 200
        ranged = httpx.get(
            server.url + "/tiny-v2.gguf",
            headers={"Authorization": f"Bearer {TOKEN}", "Range": "bytes=10-19"},
        )
        assert (ranged.status_code, ranged.content) == (206, data[10:20])


@pytest.mark.anyio
async def test_a_node_downloads_with_its_token_and_fails_clearly_without(
    artifacts: tuple[Path, bytes], tmp_path: Path
) -> None:
    root, data = artifacts
    with protected(root) as server:
        rec = record_for("tiny", "v2", server.url + "/tiny-v2.gguf", data)
        anonymous = Downloader(ModelDir(tmp_path / "anon"), attempts=1)
        with pytest.raises(SourceUnavailable, match="HTTP 401"):
            await anonymous.fetch(rec)
        peer = PeerSettings.model_validate({"token": TOKEN}).credentials()
        path = await Downloader(ModelDir(tmp_path / "models"), peer=peer).fetch(rec)
    assert path.read_bytes() == data


@pytest.mark.anyio
async def test_a_node_downloads_over_tls_against_the_fleet_ca_only(
    artifacts: tuple[Path, bytes], tmp_path: Path
) -> None:
    root, data = artifacts
    fleet = PrivateCA(tmp_path / "pki")
    cert = fleet.issue("127.0.0.1")
    gate = TokenGate(ServiceAuthSettings.model_validate({"tokens": [TOKEN]}))
    tls = {"ssl_certfile": str(cert.cert_file), "ssl_keyfile": str(cert.key_file)}
    with UvicornThread(create_app(root, gate), loop="asyncio", **tls) as server:
        rec = record_for("tiny", "v2", server.url + "/tiny-v2.gguf", data)
        system_store = PeerSettings.model_validate({"token": TOKEN}).credentials()
        with pytest.raises(SourceUnavailable):  # the public trust store does not know the CA
            await Downloader(ModelDir(tmp_path / "a"), peer=system_store, attempts=1).fetch(rec)
        peer = PeerSettings.model_validate(
            {"token": TOKEN, "ca_file": str(fleet.ca_file), "require_tls": True}
        ).credentials()
        path = await Downloader(ModelDir(tmp_path / "b"), peer=peer).fetch(rec)
    assert path.read_bytes() == data


def test_push_reads_a_protected_url_and_stores_it_without_credentials(
    artifacts: tuple[Path, bytes], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    root, _ = artifacts
    (tmp_path / "artifact-token").write_text(TOKEN + "\n")
    cfg = tmp_path / "model-sync.yaml"
    cfg.write_text(
        "registry: {{backend: embedded, embedded: {{path: {}}}}}\n"
        "artifacts: {{token_file: {}}}\n".format(tmp_path / "reg.db", tmp_path / "artifact-token")
    )
    with protected(root) as server:
        # A presigned-style query credential rides along; it must not be kept.
        url = server.url + "/tiny-v2.gguf?X-Amz-Signature=deadbeef&X-Amz-Expires=60"
        args = ["--config", str(cfg), "--json", "push", url, "--model", "tiny", "--version", "v2"]
        assert main(args) == 0
    record = json.loads(capsys.readouterr().out)
    assert record["uri"] == server.url + "/tiny-v2.gguf?X-Amz-Expires=60"
    assert main(["--config", str(cfg), "--json", "history"]) == 0
    history = capsys.readouterr().out
    assert "deadbeef" not in history
    assert TOKEN not in history
    assert main(["--config", str(cfg), "--json", "list"]) == 0
    assert "deadbeef" not in capsys.readouterr().out


def test_records_history_and_node_errors_never_keep_credentials() -> None:
    rec = ArtifactRecord.model_validate(
        {
            "name": "m", "version": "v1", "filename": "m.gguf", "sha256": "0" * 64, "size": 1,
            "uri": "https://deploy:hunter2@store.example/m.gguf?token=t0k&v=1",
        }
    )  # fmt: skip
    assert rec.uri == "https://store.example/m.gguf?v=1"
    local = ArtifactRecord.model_validate({**rec.model_dump(), "uri": "/srv/a?b.gguf"})
    assert local.uri == "/srv/a?b.gguf"  # a local path is a path, not a URL
    entry = HistoryEntry(id="1", actor="ops", action="push", detail="https://u:pw@h/x.gguf abc")
    assert entry.detail == "https://***@h/x.gguf abc"
    actual = ActualState(error="GET https://h/x?access_token=zzz: HTTP 500")
    assert actual.error == "GET https://h/x?access_token=***: HTTP 500"


def test_serve_artifacts_refuses_a_missing_token_file(tmp_path: Path) -> None:
    (tmp_path / "store").mkdir()
    missing = tmp_path / "nope"
    args = ["serve-artifacts", str(tmp_path / "store"), "--tokens-file", str(missing)]
    assert main(args) == 2
