"""Model directories (HF layout) as artifacts: manifest, push, per-file resumable
download with verification, one atomic move, and refusal of unsafe paths."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import httpx
import pytest
from pydantic import ValidationError

from hybrid_llm.local.servers import UvicornThread
from model_sync import ops
from model_sync.artifacts import create_app
from model_sync.download import ChecksumMismatch, Downloader, SourceUnavailable
from model_sync.manifest import INSTALLED_MANIFEST, build_manifest, manifest_digest
from model_sync.modeldir import ModelDir
from model_sync.records import ArtifactRecord
from model_sync.store import SyncStore
from servekit.registry import Registry
from tests.model_sync.helpers import CutConnection

pytestmark = pytest.mark.anyio

FILES = {
    "config.json": b'{"model_type": "llama"}',
    "tokenizer.json": os.urandom(30_000),
    "model-00001-of-00002.safetensors": os.urandom(900_000),
    "model-00002-of-00002.safetensors": os.urandom(700_000),
    "original/params.json": b"{}",
}


def make_model_dir(root: Path) -> Path:
    for name, data in FILES.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_bytes(data)
    (root / ".complete").write_text("build stamp")  # hidden: not published
    return root


def dir_record(source: Path, uri: str, version: str = "v2") -> ArtifactRecord:
    files = build_manifest(source)
    return ArtifactRecord(
        name="smol",
        version=version,
        uri=uri,
        filename=source.name,
        sha256=manifest_digest(files),
        size=sum(f.size for f in files),
        format="hf",
        files=files,
    )


def test_manifest_lists_every_file_with_size_and_sha256(tmp_path: Path) -> None:
    source = make_model_dir(tmp_path / "SmolLM2")
    files = build_manifest(source)
    assert [f.path for f in files] == sorted(FILES)
    assert {f.path: f.size for f in files} == {k: len(v) for k, v in FILES.items()}
    # The digest covers the list: a record with an edited list no longer validates.
    rec = dir_record(source, str(source))
    tampered = rec.model_dump()
    tampered["files"][0]["size"] += 1
    tampered["size"] += 1
    with pytest.raises(ValidationError, match="digest of the manifest"):
        ArtifactRecord.model_validate(tampered)


@pytest.mark.parametrize(
    "path",
    ["../escape", "/etc/passwd", "a/../../b", "a//b", "./a", "a\\b", ".hidden", "a/.git/x", ""],
)
def test_unsafe_manifest_paths_are_refused(tmp_path: Path, path: str) -> None:
    source = make_model_dir(tmp_path / "m")
    rec = dir_record(source, str(source)).model_dump()
    rec["files"].append({"path": path, "size": 1, "sha256": "0" * 64})
    with pytest.raises(ValidationError):
        ArtifactRecord.model_validate(rec)


async def test_push_registers_a_directory_as_one_version(
    tmp_path: Path, registry: Registry
) -> None:
    source = make_model_dir(tmp_path / "SmolLM2")
    seen: list[tuple[int, int]] = []
    record = await ops.push(
        SyncStore(registry), str(source), model="smol", version="v1",
        progress=lambda d, t: seen.append((d, t)),
    )  # fmt: skip
    assert record.is_directory
    assert record.format == "hf"
    assert record.filename == "SmolLM2"
    assert record.size == sum(len(v) for v in FILES.values())
    assert record.files is not None
    assert record.sha256 == manifest_digest(record.files)
    assert seen[-1] == (record.size, record.size)
    stored = await SyncStore(registry).artifact("smol", "v1")
    assert stored == record


async def test_directory_downloads_resume_per_file_and_move_in_at_once(tmp_path: Path) -> None:
    served = tmp_path / "served"
    source = make_model_dir(served / "SmolLM2")
    app = CutConnection(create_app(served), cut_after=400_000, cuts=4)
    models = ModelDir(tmp_path / "models")
    progress: list[int] = []
    with UvicornThread(app) as server:
        rec = dir_record(source, f"{server.url}/SmolLM2/")
        async with httpx.AsyncClient() as client:
            dl = Downloader(models, client=client, retry_delay_s=0.01)
            path = await dl.fetch(rec, progress=lambda d, t: progress.append(d))
    assert path == models.root / "smol" / "v2" / "SmolLM2"
    for name, data in FILES.items():
        assert (path / name).read_bytes() == data
    assert not (path / ".complete").exists()
    assert (path / INSTALLED_MANIFEST).is_file()
    # The first four responses are cut after 400 kB: config.json is shorter; the first
    # shard is cut twice and resumed from where each cut stopped, not from zero.
    assert [r for r in app.ranges if r] == ["bytes=400000-", "bytes=800000-"]
    assert progress == sorted(progress)
    assert progress[-1] == rec.size
    assert not any((models.root / ".partial").iterdir())
    # Fetching the installed version again touches nothing.
    again = await Downloader(models, client=None).fetch(rec)
    assert again == path


async def test_a_corrupt_shard_fails_the_version_and_installs_nothing(tmp_path: Path) -> None:
    served = tmp_path / "served"
    source = make_model_dir(served / "SmolLM2")
    rec = dir_record(source, str(source))
    shard = source / "model-00002-of-00002.safetensors"
    data = bytearray(shard.read_bytes())
    data[1000] ^= 0xFF  # one flipped byte after publishing
    shard.write_bytes(bytes(data))
    models = ModelDir(tmp_path / "models")
    with pytest.raises(ChecksumMismatch, match=r"model-00002-of-00002\.safetensors"):
        await Downloader(models).fetch(rec)
    assert not (models.root / "smol" / "v2").exists()
    # The good files stay in the partial directory: after the source is fixed only the
    # bad shard is fetched again.
    staging = models.partial_path("smol", "v2", "SmolLM2")
    assert (staging / "model-00001-of-00002.safetensors").is_file()
    shard.write_bytes(FILES["model-00002-of-00002.safetensors"])
    path = await Downloader(models).fetch(rec)
    assert (path / "model-00002-of-00002.safetensors").read_bytes() == FILES[
        "model-00002-of-00002.safetensors"
    ]


async def test_a_missing_file_fails_the_version(tmp_path: Path) -> None:
    served = tmp_path / "served"
    source = make_model_dir(served / "SmolLM2")
    models = ModelDir(tmp_path / "models")
    with UvicornThread(create_app(served)) as server:
        rec = dir_record(source, f"{server.url}/SmolLM2")
        (source / "tokenizer.json").unlink()
        with pytest.raises(SourceUnavailable, match=r"tokenizer\.json: HTTP 404"):
            await Downloader(models).fetch(rec)
    assert not (models.root / "smol" / "v2").exists()


async def test_a_planted_symlink_in_the_staging_directory_is_refused(tmp_path: Path) -> None:
    source = make_model_dir(tmp_path / "served" / "SmolLM2")
    rec = dir_record(source, str(source))
    models = ModelDir(tmp_path / "models")
    staging = models.partial_path("smol", "v2", "SmolLM2")
    staging.mkdir(parents=True)
    outside = tmp_path / "outside"
    outside.mkdir()
    (staging / "original").symlink_to(outside)
    with pytest.raises(ValueError, match="resolves outside"):
        await Downloader(models).fetch(rec)
    assert list(outside.iterdir()) == []


def test_single_files_keep_their_own_digest() -> None:
    rec: dict[str, Any] = {"name": "m", "version": "v1", "uri": "/x.gguf",
                           "filename": "x.gguf", "sha256": "a" * 64, "size": 3}  # fmt: skip
    record = ArtifactRecord.model_validate(rec)
    assert not record.is_directory
    assert record.format == "gguf"
