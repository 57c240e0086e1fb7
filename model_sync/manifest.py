"""A model directory as one artifact: the manifest of its files.

A directory in HF layout (``config.json``, tokenizer files, safetensors
shards, a chat template) is published as one version whose record carries a
manifest: every file's relative path, size and sha256. The version's
``sha256`` is the digest of the manifest itself (its canonical JSON), so a
record whose file list was edited no longer matches its digest.

Manifest paths become paths on edge nodes, so they are checked strictly:
relative, ``/``-separated, no empty, ``.`` or ``..`` segment, no hidden
segment, no backslash or NUL, at most 8 levels. Hidden files in a published
directory (``.git*``, build stamps) are left out; symlinks are refused.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Callable
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field, field_validator

from model_sync.keys import InvalidName
from servekit.modelfetch import sha256_file

__all__ = [
    "INSTALLED_MANIFEST",
    "ManifestFile",
    "build_manifest",
    "check_relative_path",
    "manifest_digest",
]

# Written into an installed directory, so a node can tell what is there.
INSTALLED_MANIFEST = ".manifest.json"

_SEGMENT = re.compile(r"[A-Za-z0-9_+\-][A-Za-z0-9_.+\- ]{0,199}")
_MAX_DEPTH = 8

ProgressFn = Callable[[int, int], None]


def check_relative_path(path: str) -> str:
    """``path`` if it is a safe relative file path inside a model directory."""
    parts = path.split("/")
    if not path or len(parts) > _MAX_DEPTH:
        raise InvalidName(f"manifest path {path!r} is empty or too deep")
    for part in parts:
        if part in ("", ".", "..") or not _SEGMENT.fullmatch(part) or part.endswith(" "):
            raise InvalidName(
                f"manifest path {path!r} is not a plain relative path "
                "(no '..', no leading '/', no hidden or empty segments)"
            )
    return path


class ManifestFile(BaseModel):
    """One file of a model directory."""

    model_config = ConfigDict(extra="ignore", frozen=True)

    path: str = Field(description="Relative path inside the directory, '/'-separated.")
    size: int = Field(ge=0)
    sha256: str = Field(pattern=r"^[0-9a-f]{64}$")

    @field_validator("path")
    @classmethod
    def _safe(cls, v: str) -> str:
        return check_relative_path(v)


def manifest_digest(files: list[ManifestFile]) -> str:
    """sha256 of the manifest's canonical JSON (sorted by path, compact)."""
    rows = [[f.path, f.size, f.sha256] for f in sorted(files, key=lambda f: f.path)]
    return hashlib.sha256(json.dumps(rows, separators=(",", ":")).encode()).hexdigest()


def build_manifest(directory: Path, progress: ProgressFn | None = None) -> list[ManifestFile]:
    """Hash every (non-hidden) file below ``directory``; progress is over all bytes."""
    root = directory.resolve()
    if not root.is_dir():
        raise FileNotFoundError(f"{directory}: not a directory")
    paths: list[Path] = []
    for path in sorted(root.rglob("*")):
        relative = path.relative_to(root)
        if any(part.startswith(".") for part in relative.parts):
            continue
        if path.is_symlink():
            raise InvalidName(f"{path}: symlinks are not published (copy the file in)")
        if path.is_file():
            paths.append(path)
    if not paths:
        raise FileNotFoundError(f"{directory}: no files to publish")
    total = sum(p.stat().st_size for p in paths)
    done = 0
    files: list[ManifestFile] = []
    for path in paths:
        base = done

        def step(n: int, _size: int, base: int = base) -> None:
            if progress is not None:
                progress(base + n, total)

        digest = sha256_file(path, step)
        size = path.stat().st_size
        done += size
        files.append(ManifestFile(path=path.relative_to(root).as_posix(), size=size, sha256=digest))
    return files
