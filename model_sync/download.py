"""Fetch a registered artifact into the versioned model directory, safely.

The order is what makes it safe: check free space first, stream into a
``.part`` file (resuming with ``Range`` after a dropped connection), verify
size and sha256, and only then rename into ``<root>/<name>/<version>/<file>``.
A file that fails verification is deleted and never reaches the versioned
directory, so nothing can load it. Sources: ``http(s)://`` (any server with
range support), ``file://`` URLs and plain local paths.

httpx errors are translated into :class:`DownloadError` here and nowhere else.
"""

from __future__ import annotations

import errno
import os
import shutil
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO
from urllib.parse import unquote, urlsplit
from urllib.request import url2pathname

import anyio
import anyio.to_thread
import httpx

from model_sync.modeldir import ModelDir
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

    async def fetch(self, record: ArtifactRecord, progress: ProgressFn | None = None) -> Path:
        """Return the verified file's path, downloading (or resuming) it if needed."""
        final = self.model_dir.file_path(record.name, record.version, record.filename)
        if _size(final) is not None and await self._verified(final, record):
            return final
        partial = self.model_dir.partial_path(record.name, record.version, record.filename)
        have = _prepare_partial(partial, record.size)
        self._check_space(record.size - have)

        last: Exception | None = None
        for _ in range(self.attempts):
            try:
                await self._transfer(record, partial, progress)
                break
            except httpx.TransportError as exc:  # dropped mid-body, refused, timed out
                last = exc
                await anyio.sleep(self.retry_delay_s)
            except ChecksumMismatch:
                partial.unlink(missing_ok=True)
                raise
            except OSError as exc:
                if exc.errno != errno.ENOSPC:
                    raise
                raise InsufficientSpace(
                    f"disk full in {self.model_dir.root} while writing {record.filename}"
                ) from None
        else:
            raise SourceUnavailable(
                f"{record.uri}: gave up after {self.attempts} attempts: {last!r}"
            )

        if not await self._verified(partial, record):
            got = _size(partial) or 0
            partial.unlink(missing_ok=True)
            what = f"truncated ({got} of {record.size} bytes)" if got < record.size else "corrupt"
            raise ChecksumMismatch(
                f"{record.name} {record.version}: artifact {what}: sha256 does not match "
                f"{record.sha256[:12]}…; rejected"
            )
        _install(partial, final)
        return final

    def _check_space(self, needed: int) -> None:
        self.model_dir.root.mkdir(parents=True, exist_ok=True)
        free = self.free_space(self.model_dir.root)
        if free < needed + self.reserve_bytes:
            raise InsufficientSpace(
                f"not enough disk space in {self.model_dir.root}: need {_mib(needed)} "
                f"(+{_mib(self.reserve_bytes)} reserve), {_mib(free)} free"
            )

    async def _verified(self, path: Path, record: ArtifactRecord) -> bool:
        if _size(path) != record.size:
            return False
        digest = await anyio.to_thread.run_sync(sha256_file, path)
        return digest == record.sha256

    async def _transfer(
        self, record: ArtifactRecord, partial: Path, progress: ProgressFn | None
    ) -> None:
        source = local_source(record.uri)
        offset = _size(partial) or 0
        if offset >= record.size:
            return
        if source is not None:
            await self._copy_local(source, record, partial, offset, progress)
        elif self.client is not None:
            await self._get(self.client, record, partial, offset, progress)
        else:
            timeout = httpx.Timeout(30.0, connect=10.0)
            # httpx drops the Authorization header on a redirect to another host.
            client = async_client(self.peer, timeout=timeout, follow_redirects=True)
            async with client:
                await self._get(client, record, partial, offset, progress)

    async def _get(
        self,
        client: httpx.AsyncClient,
        record: ArtifactRecord,
        partial: Path,
        offset: int,
        progress: ProgressFn | None,
    ) -> None:
        headers = {"Range": f"bytes={offset}-"} if offset else {}
        async with client.stream("GET", record.uri, headers=headers) as resp:
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
        record: ArtifactRecord,
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
        record: ArtifactRecord,
        progress: ProgressFn | None,
    ) -> int:
        if done + len(chunk) > record.size:
            raise ChecksumMismatch(
                f"{record.name} {record.version}: source is larger than the registered "
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


def _mib(n: int) -> str:
    return f"{n / (1 << 20):.1f} MiB"
