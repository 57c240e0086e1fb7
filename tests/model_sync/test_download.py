from __future__ import annotations

import socket
from pathlib import Path

import httpx
import pytest

from hybrid_llm.local.servers import UvicornThread
from model_sync.artifacts import create_app
from model_sync.download import (
    ChecksumMismatch,
    Downloader,
    InsufficientSpace,
    SourceUnavailable,
)
from model_sync.keys import InvalidName
from model_sync.modeldir import ModelDir, UnsafePath
from model_sync.records import ArtifactRecord
from tests.model_sync.helpers import CutConnection, make_artifact, record_for

pytestmark = pytest.mark.anyio


async def test_local_path_lands_in_versioned_dir_and_is_idempotent(tmp_path: Path) -> None:
    data, _ = make_artifact(tmp_path / "src" / "m.gguf")
    rec = record_for("tiny", "v1", str(tmp_path / "src" / "m.gguf"), data)
    seen: list[tuple[int, int]] = []
    dl = Downloader(ModelDir(tmp_path / "models"), chunk_size=256 * 1024)
    path = await dl.fetch(rec, progress=lambda d, t: seen.append((d, t)))
    assert path == (tmp_path / "models" / "tiny" / "v1" / "model.gguf").resolve()
    assert path.read_bytes() == data
    assert seen[-1] == (len(data), len(data))
    assert [d for d, _ in seen] == sorted(d for d, _ in seen)
    # Second fetch verifies what is there and transfers nothing.
    seen.clear()
    assert await dl.fetch(rec, progress=lambda d, t: seen.append((d, t))) == path
    assert seen == []


async def test_file_url(tmp_path: Path) -> None:
    data, _ = make_artifact(tmp_path / "a b" / "m.gguf", 10_000)
    rec = record_for("tiny", "v1", (tmp_path / "a b" / "m.gguf").as_uri(), data)
    path = await Downloader(ModelDir(tmp_path / "models")).fetch(rec)
    assert path.read_bytes() == data


async def test_corrupted_artifact_rejected_and_never_installed(tmp_path: Path) -> None:
    data, _ = make_artifact(tmp_path / "m.gguf", 100_000)
    rec = record_for("tiny", "v1", str(tmp_path / "m.gguf"), data)
    # One flipped byte after registration.
    (tmp_path / "m.gguf").write_bytes(data[:500] + bytes([data[500] ^ 1]) + data[501:])
    models = ModelDir(tmp_path / "models")
    with pytest.raises(ChecksumMismatch, match="sha256 does not match"):
        await Downloader(models).fetch(rec)
    assert not (models.root / "tiny" / "v1").exists()
    assert list((models.root / ".partial").iterdir()) == []


async def test_truncated_artifact_over_http_rejected(tmp_path: Path) -> None:
    root = tmp_path / "served"
    data, _ = make_artifact(root / "m.gguf", 300_000)
    rec_uri_file = root / "m.gguf"
    rec_uri_file.write_bytes(data[:200_000])  # the published file lost its tail
    models = ModelDir(tmp_path / "models")
    with UvicornThread(create_app(root)) as server:
        rec = record_for("tiny", "v1", f"{server.url}/m.gguf", data)
        with pytest.raises(ChecksumMismatch, match=r"truncated \(200000 of 300000"):
            await Downloader(models).fetch(rec)
    assert not (models.root / "tiny" / "v1" / "model.gguf").exists()


async def test_source_larger_than_registered_is_rejected(tmp_path: Path) -> None:
    data, _ = make_artifact(tmp_path / "m.gguf", 50_000)
    rec = record_for("tiny", "v1", str(tmp_path / "m.gguf"), data[:40_000])
    with pytest.raises(ChecksumMismatch, match="larger than the registered"):
        await Downloader(ModelDir(tmp_path / "models")).fetch(rec)


async def test_interrupted_download_resumes_with_range(tmp_path: Path) -> None:
    root = tmp_path / "served"
    data, _ = make_artifact(root / "m.gguf", 2_000_000)
    app = CutConnection(create_app(root), cut_after=700_000, cuts=2)
    seen: list[int] = []
    with UvicornThread(app) as server:
        rec = record_for("tiny", "v2", f"{server.url}/m.gguf", data)
        async with httpx.AsyncClient() as client:
            dl = Downloader(ModelDir(tmp_path / "models"), client=client, retry_delay_s=0.01)
            path = await dl.fetch(rec, progress=lambda d, t: seen.append(d))
    assert path.read_bytes() == data
    # First request from zero, then two resumes from where each cut left off.
    assert app.ranges[0] is None
    assert all(r and r.startswith("bytes=") for r in app.ranges[1:])
    offsets = [int(r.removeprefix("bytes=").rstrip("-")) for r in app.ranges[1:] if r]
    assert len(offsets) == 2
    assert 0 < offsets[0] < offsets[1] < len(data)
    assert seen[-1] == len(data)


async def test_partial_file_from_an_earlier_run_is_resumed(tmp_path: Path) -> None:
    root = tmp_path / "served"
    data, _ = make_artifact(root / "m.gguf", 500_000)
    models = ModelDir(tmp_path / "models")
    partial = models.partial_path("tiny", "v1", "model.gguf")
    partial.parent.mkdir(parents=True)
    partial.write_bytes(data[:123_456])
    app = CutConnection(create_app(root), cut_after=0, cuts=0)
    with UvicornThread(app) as server:
        rec = record_for("tiny", "v1", f"{server.url}/m.gguf", data)
        path = await Downloader(models).fetch(rec)
    assert path.read_bytes() == data
    assert app.ranges == ["bytes=123456-"]


async def test_disk_full_is_reported_before_downloading(tmp_path: Path) -> None:
    data, _ = make_artifact(tmp_path / "m.gguf", 100_000)
    rec = record_for("tiny", "v1", str(tmp_path / "m.gguf"), data)
    models = ModelDir(tmp_path / "models")
    dl = Downloader(models, free_space=lambda _p: 50_000)
    with pytest.raises(InsufficientSpace, match=r"need 0\.1 MiB .* 0\.0 MiB free"):
        await dl.fetch(rec)
    assert not (models.root / "tiny").exists()


async def test_http_404_is_source_unavailable(tmp_path: Path) -> None:
    with UvicornThread(create_app(tmp_path)) as server:
        rec = record_for("tiny", "v1", f"{server.url}/nope.gguf", b"x")
        with pytest.raises(SourceUnavailable, match="HTTP 404"):
            await Downloader(ModelDir(tmp_path / "models")).fetch(rec)


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("name", "../etc"),
        ("version", ".."),
        ("version", "v1/../../x"),
        ("filename", "../../.bashrc"),
        ("filename", ".hidden"),
        ("filename", "a\\b"),
        ("name", "/abs"),
    ],
)
def test_record_names_cannot_escape(field: str, value: str) -> None:
    fields = {
        "name": "tiny",
        "version": "v1",
        "uri": "/x",
        "filename": "m.gguf",
        "sha256": "0" * 64,
        "size": 1,
    } | {field: value}
    with pytest.raises(ValueError, match="invalid"):
        ArtifactRecord.model_validate(fields)


def test_modeldir_rejects_traversal_and_planted_symlinks(tmp_path: Path) -> None:
    models = ModelDir(tmp_path / "models")
    with pytest.raises(InvalidName):
        models.file_path("tiny", "..", "x")
    outside = tmp_path / "outside"
    outside.mkdir()
    (models.root / "tiny").mkdir(parents=True)
    (models.root / "tiny" / "v9").symlink_to(outside)
    with pytest.raises(UnsafePath):
        models.file_path("tiny", "v9", "m.gguf")
    # GC never follows the symlink out of the tree.
    (outside / "keep.txt").write_text("x")
    models.gc("tiny", keep=set())
    assert (outside / "keep.txt").exists()


def test_gc_keeps_only_what_is_asked(tmp_path: Path) -> None:
    models = ModelDir(tmp_path / "models")
    for v in ("v1", "v2", "v3"):
        models.version_dir("tiny", v).mkdir(parents=True)
    assert sorted(models.gc("tiny", keep={"v2", "v3"})) == ["v1"]
    assert sorted(models.installed("tiny")) == ["v2", "v3"]


def _raw_get(port: int, target: str) -> bytes:
    with socket.create_connection(("127.0.0.1", port), timeout=5) as s:
        s.sendall(f"GET {target} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n".encode())
        chunks = []
        while chunk := s.recv(65536):
            chunks.append(chunk)
    return b"".join(chunks)


def test_artifact_server_ranges_and_traversal(tmp_path: Path) -> None:
    root = tmp_path / "served"
    data, _ = make_artifact(root / "sub" / "m.gguf", 10_000)
    (tmp_path / "secret.txt").write_text("top secret")
    (root / "link.txt").symlink_to(tmp_path / "secret.txt")
    with UvicornThread(create_app(root)) as server:
        r = httpx.get(f"{server.url}/sub/m.gguf", headers={"Range": "bytes=100-199"})
        assert r.status_code == 206
        assert r.content == data[100:200]
        assert r.headers["content-range"] == f"bytes 100-199/{len(data)}"
        assert httpx.get(f"{server.url}/sub/m.gguf").content == data
        r = httpx.get(f"{server.url}/sub/m.gguf", headers={"Range": "bytes=20000-"})
        assert r.status_code == 416
        for target in (
            "/../secret.txt",
            "/sub/../../secret.txt",
            "/%2e%2e/secret.txt",
            "/sub/%2E%2E/%2e%2e/secret.txt",
            "/..%2fsecret.txt",
            "/link.txt",
            "//etc/passwd",
        ):
            raw = _raw_get(server.port, target)
            assert b"top secret" not in raw, target
            assert b"root:" not in raw, target
            assert raw.startswith((b"HTTP/1.1 404", b"HTTP/1.1 400")), (target, raw[:40])
