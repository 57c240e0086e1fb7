"""The edge side of a rollout: keep one node on its desired model version.

:class:`Reconciler` watches ``nodes/<id>/desired``. When it names a version
the node does not serve, it resolves the version record, downloads and
verifies the artifact (:mod:`model_sync.download`), hands the file to the
agent's ``swap`` callable and reports every stage in ``nodes/<id>/actual``.

``swap(path, version)`` belongs to the edge agent: it loads the new engine
beside the old one (or drains first when memory is short), warms it, swaps
atomically so in-flight requests finish on the old engine, and raises if the
load fails. Whatever fails - registry lookup, download, verification, load -
the node keeps serving what it served and reports ``state="failed"`` with the
error; a failed target is not retried until the desired document changes
(except for transient source and disk-space errors, retried after a pause).

With ``trusted_keys`` set, a record is verified against the operator's
signature (:mod:`model_sync.signing`) before anything is downloaded or an
installed copy is reused: an unsigned record, a bad signature or an
untrusted key fails the target the same way, naming why.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import anyio
import httpx
from pydantic import Field, field_validator

from model_sync import keys
from model_sync.download import Downloader, InsufficientSpace, SourceUnavailable
from model_sync.modeldir import ModelDir
from model_sync.records import ActualState, ArtifactRecord, DesiredState
from model_sync.signing import RecordVerifier, parse_public_key
from model_sync.store import SyncStore
from servekit.engine.protocol import LoadReport
from servekit.peers import PeerSettings
from servekit.registry.protocol import KVStore, RegistryError
from servekit.secrets import SecretSettings

__all__ = ["Reconciler", "ReconcilerSettings", "StatsFn", "SwapFn"]

log = logging.getLogger(__name__)

SwapFn = Callable[[Path, str], Awaitable[None]]
StatsFn = Callable[[], LoadReport]


class ReconcilerSettings(SecretSettings):
    """The ``model_sync:`` block of an edge agent's settings."""

    # Public keys are no secret: SecretSettings is here for its sources, so the
    # list may also come from trusted_keys_file (one per line) or trusted_keys_env.
    secret_fields = ("trusted_keys",)
    enabled: bool = Field(True, description="Follow nodes/<id>/desired from the registry.")
    model_dir: Path = Field(Path("var/models"), description="Versioned model directory.")
    keep_versions: int = Field(2, ge=1, description="Installed versions kept (serving + previous).")
    reserve_bytes: int = Field(0, ge=0, description="Disk space left free beyond the artifact.")
    watch_timeout_s: float = Field(10.0, gt=0, description="Blocking watch on desired.")
    report_interval_s: float = Field(5.0, gt=0, description="Refresh of actual's load figures.")
    retry_after_s: float = Field(30.0, gt=0, description="Retry after source or disk errors.")
    artifacts: PeerSettings = Field(
        default_factory=PeerSettings,
        description="Token and TLS trust for downloading artifacts (model-sync serve-artifacts "
        "or any HTTP store).",
    )
    local_roots: list[Path] = Field(
        default_factory=lambda: [Path("models")],
        description="Directories a file:// or plain-path artifact may be copied from (relative "
        "to the working directory); any other local source is refused. Empty: none.",
    )
    trusted_keys: list[str] = Field(
        default_factory=list,
        description="Operator public keys (ed25519:<base64>, from `model-sync keygen`) whose "
        "signature a version record must carry before it is downloaded; several during a key "
        "rotation. Empty: records are not verified (set it in production).",
    )

    @field_validator("trusted_keys")
    @classmethod
    def _keys_parse(cls, v: list[str]) -> list[str]:
        for text in v:
            parse_public_key(text)
        return v


class Reconciler:
    """Drives one node toward ``nodes/<node_id>/desired``; run :meth:`run` as a task.

    ``model``/``version`` are what the node serves at start. ``stats`` (the
    agent's live load report) fills the request counters and TTFT P95 that
    rollout gates read. ``keep_versions`` installed versions stay on disk
    (the serving one and the previous, for instant rollback).
    """

    def __init__(
        self,
        kv: KVStore,
        node_id: str,
        model_dir: Path,
        swap: SwapFn,
        *,
        model: str,
        version: str = "",
        downloader: Downloader | None = None,
        stats: StatsFn | None = None,
        keep_versions: int = 2,
        watch_timeout_s: float = 10.0,
        report_interval_s: float = 5.0,
        progress_interval_s: float = 0.5,
        retry_after_s: float = 30.0,
        verifier: RecordVerifier | None = None,
    ) -> None:
        self.node_id = keys.check_node_id(node_id)
        self.store = SyncStore(kv, actor=f"node:{node_id}")
        self.models = ModelDir(model_dir)
        self.downloader = downloader or Downloader(self.models)
        self.swap = swap
        self.stats = stats
        self.keep_versions = max(1, keep_versions)
        self.watch_timeout_s = watch_timeout_s
        self.report_interval_s = report_interval_s
        self.progress_interval_s = progress_interval_s
        self.retry_after_s = retry_after_s
        self.verifier = verifier
        self.actual = ActualState(model=model, version=version)
        self._served: list[str] = [version] if version else []  # most recent last
        self._handled_index = 0
        self._retry_at: float | None = None
        self._last_report = 0.0

    @classmethod
    def from_settings(
        cls,
        settings: ReconcilerSettings,
        kv: KVStore,
        node_id: str,
        swap: SwapFn,
        *,
        model: str,
        version: str,
        stats: StatsFn | None = None,
        client: httpx.AsyncClient | None = None,
    ) -> Reconciler:
        """Build one from an edge agent's settings; ``client`` is borrowed for downloads."""
        models = ModelDir(settings.model_dir)
        return cls(
            kv,
            node_id,
            settings.model_dir,
            swap,
            model=model,
            version=version,
            downloader=Downloader(
                models,
                client=client,
                peer=settings.artifacts.credentials(),
                reserve_bytes=settings.reserve_bytes,
                local_roots=tuple(settings.local_roots),
            ),
            stats=stats,
            keep_versions=settings.keep_versions,
            watch_timeout_s=settings.watch_timeout_s,
            report_interval_s=settings.report_interval_s,
            retry_after_s=settings.retry_after_s,
            verifier=RecordVerifier(settings.trusted_keys) if settings.trusted_keys else None,
        )

    async def run(self) -> None:
        """Watch and reconcile until cancelled; registry outages are waited out."""
        key = keys.desired_key(self.node_id)
        index = 0
        if self.verifier is None:
            log.warning(
                "node %s: version records are not verified (model_sync.trusted_keys is empty): "
                "whoever can write the registry chooses what this node loads",
                self.node_id,
            )
        await self._report_safely()
        while True:
            try:
                index, entries = await self.store.kv.watch_prefix(key, index, self.watch_timeout_s)
                entry = next((e for e in entries if e.key == key), None)
                due_retry = self._retry_at is not None and time.monotonic() >= self._retry_at
                if entry is not None and (entry.modify_index != self._handled_index or due_retry):
                    self._handled_index = entry.modify_index
                    desired = DesiredState.model_validate_json(entry.value)
                    await self.reconcile(desired)
                elif time.monotonic() - self._last_report >= self.report_interval_s:
                    await self._report()
            except RegistryError as exc:
                log.warning("registry unavailable (%s); retrying", exc)
                index = self._handled_index = 0  # reconciling again is idempotent
                await anyio.sleep(min(self.watch_timeout_s, 2.0))
            except ValueError as exc:  # an unreadable desired document
                log.error("%s: invalid desired state: %s", key, exc)
                with contextlib.suppress(RegistryError):
                    await self._report(state="failed", error=f"invalid desired state: {exc}")

    def trust(self, trusted_keys: list[str]) -> None:
        """Verify records against ``trusted_keys`` from now on (an edge's SIGHUP reload),
        logging the ids of the keys added and removed. A target that failed is tried
        again (a record signed by a newly trusted key installs without a new desired
        version). An empty list where keys were trusted would stop verification: it
        is refused with an error and the running keys stay until a restart."""
        before = set(self.verifier.keys) if self.verifier is not None else set()
        verifier = RecordVerifier(trusted_keys) if trusted_keys else None
        after = set(verifier.keys) if verifier is not None else set()
        if before and not after:
            log.error(
                "node %s: reload leaves model_sync.trusted_keys empty, which would stop "
                "verifying version records; still trusting %s (restart to turn it off)",
                self.node_id,
                ", ".join(sorted(before)),
            )
            return
        if after == before:
            return
        self.verifier = verifier
        log.warning(
            "node %s: trusted keys reloaded: added %s, removed %s; now trusting %s",
            self.node_id,
            ", ".join(sorted(after - before)) or "none",
            ", ".join(sorted(before - after)) or "none",
            ", ".join(sorted(after)),
        )
        if self.actual.state == "failed":
            self._retry_at = time.monotonic()  # the next watch round tries it again

    async def reconcile(self, desired: DesiredState) -> None:
        """Bring the node to ``desired`` once; never raises for a failed attempt."""
        self._retry_at = None
        if (desired.model, desired.version) == (self.actual.model, self.actual.version):
            await self._report(state="serving", target=None, progress=1.0, error=None)
            return
        target = desired.version
        try:
            record = await self.store.artifact(desired.model, target)
            if record is None:
                raise LookupError(f"{desired.model} {target} is not a registered version")
            if self.verifier is not None:
                self.verifier.verify(record)
            await self._report(state="downloading", target=target, progress=0.0, error=None)
            path = await self._download(record)
            await self._report(state="loading", target=target, progress=1.0)
            await self.swap(path, target)
        except _Superseded:
            log.info("node %s: %s superseded during download", self.node_id, target)
            return
        except (SourceUnavailable, InsufficientSpace) as exc:
            self._retry_at = time.monotonic() + self.retry_after_s
            await self._failed(target, exc)
            return
        except Exception as exc:  # the swap callable is foreign: any failure keeps the old one
            await self._failed(target, exc)
            return
        self._served = [v for v in self._served if v != target] + [target]
        await self._report(
            state="serving", model=desired.model, version=target, target=None, error=None
        )
        self._collect_garbage(desired.model)

    async def _download(self, record: ArtifactRecord) -> Path:
        """Fetch with progress reports; gives up early (:class:`_Superseded`) when the
        desired document changes meanwhile, keeping the partial file for later."""
        latest = [0.0]
        failure: Exception | None = None
        superseded = False
        key = keys.desired_key(self.node_id)

        def on_progress(done: int, total: int) -> None:
            latest[0] = done / total if total else 1.0

        async with anyio.create_task_group() as tg:

            async def publish() -> None:
                nonlocal superseded
                while True:
                    await anyio.sleep(self.progress_interval_s)
                    await self._report(progress=latest[0])
                    entry = await self.store.kv.get(key)
                    if entry is not None and entry.modify_index != self._handled_index:
                        superseded = True
                        tg.cancel_scope.cancel()

            tg.start_soon(publish)
            try:
                path = await self.downloader.fetch(record, progress=on_progress)
            except Exception as exc:
                failure = exc  # raised below, outside the group, as itself
            finally:
                tg.cancel_scope.cancel()
        if superseded:
            raise _Superseded
        if failure is not None:
            raise failure
        return path

    async def _failed(self, target: str, exc: BaseException) -> None:
        message = f"{type(exc).__name__}: {exc}"
        log.error("node %s: %s %s failed: %s", self.node_id, self.actual.model, target, message)
        await self._report(state="failed", target=target, error=message)

    def _collect_garbage(self, model: str) -> None:
        keep = set(self._served[-self.keep_versions :])
        try:
            removed = self.models.gc(model, keep)
        except OSError as exc:
            log.warning("garbage collection of %s failed: %s", model, exc)
            return
        if removed:
            log.info("removed old versions of %s: %s", model, ", ".join(removed))

    async def _report(self, **changes: Any) -> None:
        """Apply ``changes`` to the actual state, refresh the load figures, publish it."""
        update = dict(changes)
        if self.stats is not None:
            load = self.stats()
            update |= {
                "ttft_p95_ms": load.ttft_p95_ms,
                "requests_ok": load.requests_ok,
                "requests_failed": load.requests_failed,
            }
        update["updated_at"] = time.time()
        self.actual = self.actual.model_copy(update=update)
        self._last_report = time.monotonic()
        await self.store.set_actual(self.node_id, self.actual)

    async def _report_safely(self) -> None:
        try:
            await self._report()
        except RegistryError as exc:
            log.warning("could not report actual state: %s", exc)


class _Superseded(Exception):
    """The desired version changed while this one was downloading."""
