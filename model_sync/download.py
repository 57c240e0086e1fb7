"""Fetch a registered artifact into the versioned model directory, safely.

The order is what makes it safe: check free space first, stream into a
``.part`` file (resuming with ``Range`` after a dropped connection), verify
size and sha256, and only then rename into ``<root>/<name>/<version>/<file>``.
A file that fails verification is deleted and never reaches the versioned
directory, so nothing can load it. Sources: ``http(s)://`` (any server with
range support), ``file://`` URLs and plain local paths. A local source must
lie under one of ``local_roots`` (a record that names ``/etc/shadow`` or a
credentials file is refused, not copied into a model directory), and an HTTP
redirect is followed only to the same scheme, host and port (a token or a
trusted source is never traded for another host's bytes).

A model directory (a record with a manifest) is fetched file by file into
``<root>/.partial/<name>--<version>--<dir>/``: each file resumes on its own,
is verified on its own (a corrupt or missing file fails the version, naming
it), and only when every file is verified does the whole directory move into
``<root>/<name>/<version>/<dir>`` with one rename. Manifest paths were checked
when the record was read and are resolved inside the partial directory again
before anything is written. An installed directory is trusted only after
every file hashes to its manifest again (its marker alone proves nothing),
and a replaced directory is moved aside before the new one is renamed in, so
the path never holds a half-deleted tree.

httpx errors are translated into :class:`DownloadError` here and nowhere else.
"""

from __future__ import annotations

import contextlib
import errno
import os
import shutil
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO
from urllib.parse import quote, unquote, urlsplit
from urllib.request import url2pathname

import anyio
import anyio.to_thread
import httpx

from model_sync.manifest import INSTALLED_MANIFEST
from model_sync.modeldir import ModelDir, UnsafePath, within
from model_sync.records import ArtifactRecord
from servekit.modelfetch import sha256_file
from servekit.peers import PeerCredentials, async_client

__all__ = [
    "ChecksumMismatch",
    "DownloadError",
    "Downloader",
    "FreeSpaceFn",
    "InsufficientSpace",
    "ProgressFn",
    "SourceUnavailable",
    "disk_free",
    "local_source",
]

ProgressFn = Callable[[int, int], None]
FreeSpaceFn = Callable[[Path], int]


class DownloadError(Exception):
    """The artifact could not be made available; the node keeps what it serves."""


class ChecksumMismatch(DownloadError):
    """The bytes do not match the registered size or sha256 (corrupt or truncated)."""


class InsufficientSpace(DownloadError):
    """Not enough free disk space for the artifact."""


class SourceUnavailable(DownloadError):
    """The source could not be read (HTTP error, connection kept failing, missing file)."""


def disk_free(path: Path) -> int:
    return shutil.disk_usage(path).free


def local_source(uri: str) -> Path | None:
    """The local path a ``file://`` URL or plain path names; ``None`` for http(s)."""
    parts = urlsplit(uri)
    if parts.scheme in ("http", "https"):
        return None
    if parts.scheme == "file":
        return Path(url2pathname(unquote(parts.path)))
    if parts.scheme == "" or len(parts.scheme) == 1:  # plain path (or a drive letter)
        return Path(uri)
    raise SourceUnavailable(f"unsupported artifact URI scheme {parts.scheme!r} in {uri}")


@dataclass(frozen=True, slots=True)
class _Part:
    """One file to fetch: where from, how big, what it must hash to."""

    uri: str
    size: int
    sha256: str
    label: str


@dataclass
class Downloader:
    """Downloads artifacts into ``model_dir``.

    ``free_space`` reports free bytes for a directory (``disk_free`` by
    default; a node may pass its own reading, e.g. a quota). ``reserve_bytes``
    is kept free on top of the artifact. ``client`` is borrowed, not closed;
    without one, each download gets a client with ``peer``'s token and TLS trust.
    """

    model_dir: ModelDir
    client: httpx.AsyncClient | None = None
    peer: PeerCredentials | None = None
    free_space: FreeSpaceFn = disk_free
    reserve_bytes: int = 0
    attempts: int = 6
    retry_delay_s: float = 0.25
    chunk_size: int = 1 << 20
    local_roots: tuple[Path, ...] | None = None
    """Directories local sources may come from; ``None`` (library default): any."""
    max_redirects: int = 5

    async def fetch(self, record: ArtifactRecord, progress: ProgressFn | None = None) -> Path:
        """Return the verified file's (or directory's) path, downloading or resuming it."""
        if record.files is not None:
            return await self._fetch_directory(record, progress)
        final = self.model_dir.file_path(record.name, record.version, record.filename)
        part = _Part(record.uri, record.size, record.sha256, f"{record.name} {record.version}")
        if _size(final) is not None and await self._verified(final, part):
            return final
        partial = self.model_dir.partial_path(record.name, record.version, record.filename)
        have = _prepare_partial(partial, record.size)
        self._check_space(record.size - have)
        await self._fetch_part(part, partial, progress)
        _install(partial, final)
        return final

    async def _fetch_directory(self, record: ArtifactRecord, progress: ProgressFn | None) -> Path:
        assert record.files is not None
        final = self.model_dir.file_path(record.name, record.version, record.filename)
        if _installed_manifest(final) == record.sha256 and await self._all_verified(record, final):
            return final
        staging = self.model_dir.partial_path(record.name, record.version, record.filename)
        staging.mkdir(parents=True, exist_ok=True)
        targets = [(f, self.model_dir.inside(staging, staging / f.path)) for f in record.files]
        have = sum(min(_size(path) or 0, f.size) for f, path in targets)
        self._check_space(record.size - have)
        base = 0
        for entry, path in targets:
            part = _Part(_join(record.uri, entry.path), entry.size, entry.sha256,
                         f"{record.name} {record.version}: {entry.path}")  # fmt: skip
            offset = base

            def step(done: int, _total: int, offset: int = offset) -> None:
                if progress is not None:
                    progress(offset + done, record.size)

            if not (_size(path) == entry.size and await self._verified(path, part)):
                if _size(path) == entry.size:
                    _discard(path)  # complete but wrong: an earlier copy of a corrupt source
                _prepare_partial(path, entry.size)
                await self._fetch_part(part, path, step)
            base += entry.size
        (staging / INSTALLED_MANIFEST).write_text(record.model_dump_json(), encoding="utf-8")
        await anyio.to_thread.run_sync(_install_directory, staging, final)
        return final

    async def _fetch_part(self, part: _Part, partial: Path, progress: ProgressFn | None) -> None:
        """Download (or resume) one file into ``partial`` and verify it; raises if bad."""
        last: Exception | None = None
        for _ in range(self.attempts):
            try:
                await self._transfer(part, partial, progress)
                break
            except httpx.TransportError as exc:  # dropped mid-body, refused, timed out
                last = exc
                await anyio.sleep(self.retry_delay_s)
            except ChecksumMismatch:
                _discard(partial)
                raise
            except OSError as exc:
                if exc.errno != errno.ENOSPC:
                    raise
                raise InsufficientSpace(
                    f"disk full in {self.model_dir.root} while writing {part.label}"
                ) from None
        else:
            raise SourceUnavailable(f"{part.uri}: gave up after {self.attempts} attempts: {last!r}")

        if not await self._verified(partial, part):
            got = _size(partial) or 0
            _discard(partial)
            what = f"truncated ({got} of {part.size} bytes)" if got < part.size else "corrupt"
            raise ChecksumMismatch(
                f"{part.label}: artifact {what}: sha256 does not match "
                f"{part.sha256[:12]}…; rejected"
            )

    async def _all_verified(self, record: ArtifactRecord, directory: Path) -> bool:
        assert record.files is not None
        for entry in record.files:
            part = _Part("", entry.size, entry.sha256, entry.path)
            path = self.model_dir.inside(directory, directory / entry.path)
            if not await self._verified(path, part):
                return False
        return True

    def _local_allowed(self, source: Path) -> Path:
        if self.local_roots is None:
            return source
        for root in self.local_roots:
            with contextlib.suppress(UnsafePath):
                return within(root, source)
        raise SourceUnavailable(
            f"{source}: local artifact outside the allowed local_roots; refused"
        )

    def _check_space(self, needed: int) -> None:
        self.model_dir.root.mkdir(parents=True, exist_ok=True)
        free = self.free_space(self.model_dir.root)
        if free < needed + self.reserve_bytes:
            raise InsufficientSpace(
                f"not enough disk space in {self.model_dir.root}: need {_mib(needed)} "
                f"(+{_mib(self.reserve_bytes)} reserve), {_mib(free)} free"
            )

    async def _verified(self, path: Path, part: _Part) -> bool:
        if _size(path) != part.size:
            return False
        digest = await anyio.to_thread.run_sync(sha256_file, path)
        return digest == part.sha256

    async def _transfer(self, part: _Part, partial: Path, progress: ProgressFn | None) -> None:
        source = local_source(part.uri)
        offset = _size(partial) or 0
        if offset >= part.size:
            return
        if source is not None:
            source = self._local_allowed(source)
            await self._copy_local(source, part, partial, offset, progress)
        elif self.client is not None:
            await self._get(self.client, part, partial, offset, progress)
        else:
            timeout = httpx.Timeout(30.0, connect=10.0)
            client = async_client(self.peer, timeout=timeout)
            async with client:
                await self._get(client, part, partial, offset, progress)

    async def _get(
        self,
        client: httpx.AsyncClient,
        record: _Part,
        partial: Path,
        offset: int,
        progress: ProgressFn | None,
    ) -> None:
        headers = {"Range": f"bytes={offset}-"} if offset else {}
        url = httpx.URL(record.uri)
        for _ in range(self.max_redirects + 1):
            async with client.stream("GET", url, headers=headers, follow_redirects=False) as resp:
                if not resp.is_redirect:
                    await self._read(resp, record, partial, offset, progress)
                    return
                target = url.join(resp.headers["location"])
            if (target.scheme, target.host, target.port) != (url.scheme, url.host, url.port):
                raise SourceUnavailable(f"{record.uri}: redirected to another host ({target.host})")
            url = target
        raise SourceUnavailable(f"{record.uri}: more than {self.max_redirects} redirects")

    async def _read(
        self,
        resp: httpx.Response,
        record: _Part,
        partial: Path,
        offset: int,
        progress: ProgressFn | None,
    ) -> None:
        if resp.status_code == 416:
            return  # nothing past what we have: verification decides
        if resp.status_code == 206:
            if not resp.headers.get("content-range", "").startswith(f"bytes {offset}-"):
                raise SourceUnavailable(f"{record.uri}: server answered a different range")
        elif resp.status_code == 200:
            offset = 0  # no range support: start over
        elif resp.status_code >= 500:
            raise httpx.RemoteProtocolError(f"HTTP {resp.status_code}", request=resp.request)
        else:
            raise SourceUnavailable(f"GET {record.uri}: HTTP {resp.status_code}")
        with _open_at(partial, offset) as fh:
            done = offset
            async for chunk in resp.aiter_bytes():
                done = await self._write(fh, chunk, done, record, progress)

    async def _copy_local(
        self,
        source: Path,
        record: _Part,
        partial: Path,
        offset: int,
        progress: ProgressFn | None,
    ) -> None:
        try:
            src = source.open("rb")
        except OSError as exc:
            raise SourceUnavailable(f"{source}: {exc.strerror}") from None
        with src, _open_at(partial, offset) as fh:
            src.seek(offset)
            done = offset
            while chunk := await anyio.to_thread.run_sync(src.read, self.chunk_size):
                done = await self._write(fh, chunk, done, record, progress)

    async def _write(
        self,
        fh: BinaryIO,
        chunk: bytes,
        done: int,
        record: _Part,
        progress: ProgressFn | None,
    ) -> int:
        if done + len(chunk) > record.size:
            raise ChecksumMismatch(
                f"{record.label}: source is larger than the registered "
                f"{record.size} bytes; rejected"
            )
        await anyio.to_thread.run_sync(fh.write, chunk)
        done += len(chunk)
        if progress is not None:
            progress(done, record.size)
        return done


def _size(path: Path) -> int | None:
    try:
        return path.stat().st_size
    except FileNotFoundError:
        return None


def _prepare_partial(partial: Path, size: int) -> int:
    """Bytes already downloaded by an earlier attempt (0 if unusable)."""
    partial.parent.mkdir(parents=True, exist_ok=True)
    have = _size(partial) or 0
    if have > size:
        partial.unlink()
        return 0
    return have


def _open_at(partial: Path, offset: int) -> BinaryIO:
    """Open the partial file for writing from ``offset``, dropping anything past it."""
    fh = partial.open("r+b" if partial.exists() else "wb")
    fh.truncate(offset)
    fh.seek(offset)
    return fh


def _install(partial: Path, final: Path) -> None:
    """Make the verified bytes durable, then rename them into place atomically."""
    with partial.open("rb") as fh:
        os.fsync(fh.fileno())
    final.parent.mkdir(parents=True, exist_ok=True)
    os.replace(partial, final)


def _install_directory(staging: Path, final: Path) -> None:
    """fsync every file of a verified directory, then rename it into place at once."""
    for path in staging.rglob("*"):
        if path.is_file():
            with path.open("rb") as fh:
                os.fsync(fh.fileno())
    final.parent.mkdir(parents=True, exist_ok=True)
    old = final.with_name(f".replaced-{final.name}-{os.getpid()}")
    if final.exists():  # an incomplete or different copy of this version: replaced whole
        os.replace(final, old)  # aside in one rename: final is never half deleted
    os.replace(staging, final)
    if old.exists():
        shutil.rmtree(old)


def _installed_manifest(directory: Path) -> str | None:
    """The manifest digest of an installed directory, if it is one."""
    try:
        text = (directory / INSTALLED_MANIFEST).read_text(encoding="utf-8")
        return ArtifactRecord.model_validate_json(text).sha256
    except (OSError, ValueError):
        return None


def _join(base: str, relative: str) -> str:
    """A file of the directory ``base`` (a path or URL), by its manifest path."""
    root = local_source(base)
    if root is None:
        return base.rstrip("/") + "/" + quote(relative)
    path = (root / relative).resolve()
    if root.resolve() not in path.parents:
        raise SourceUnavailable(f"{relative}: resolves outside the published directory {root}")
    return str(path)


def _discard(path: Path) -> None:
    path.unlink(missing_ok=True)


def _mib(n: int) -> str:
    return f"{n / (1 << 20):.1f} MiB"
