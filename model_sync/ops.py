"""Operator actions: publish a version, start and steer a rollout, roll back.

Each action is a few KV writes plus a history entry signed with the
operator's name; the controller does the rest. Steering a running rollout
(pause, resume, promote, abort) is a compare-and-swap on its state document,
so it can never be lost in a race with the controller.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from pathlib import Path
from urllib.parse import unquote, urlsplit

import anyio.to_thread
import httpx

from model_sync import keys
from model_sync.download import ProgressFn, SourceUnavailable, local_source
from model_sync.manifest import ManifestFile, build_manifest, manifest_digest
from model_sync.records import (
    ActiveRollout,
    ActualState,
    ArtifactFormat,
    ArtifactRecord,
    DesiredState,
    RolloutPlan,
    RolloutState,
)
from model_sync.signing import SigningKey, signed_payload
from model_sync.store import ConflictError, SyncStore
from servekit.modelfetch import sha256_file
from servekit.secrets import redact_url, strip_url_credentials

__all__ = [
    "abort",
    "pause",
    "promote",
    "push",
    "resume",
    "rollback",
    "sign",
    "start_rollout",
]

_FORMATS: dict[str, ArtifactFormat] = {".gguf": "gguf"}

ChangeFn = Callable[[RolloutState], RolloutState]


async def push(
    store: SyncStore,
    source: str,
    *,
    model: str,
    version: str,
    fmt: ArtifactFormat | None = None,
    tier: str = "edge",
    notes: str = "",
    filename: str | None = None,
    progress: ProgressFn | None = None,
    client: httpx.AsyncClient | None = None,
    url: str | None = None,
    signer: SigningKey | None = None,
) -> ArtifactRecord:
    """Hash ``source`` (a file, a model directory, or a file's URL) and register it
    as ``model`` ``version``. A directory becomes one version with a manifest;
    ``url``, if given, is where nodes fetch it (e.g. its artifact-server URL).

    A URL's credentials (``user:password@``, ``?token=``...) are used for the
    hashing only; the record stores the URL without them, and the nodes
    authenticate with their own ``model_sync.artifacts`` settings. With
    ``signer`` the record carries the operator's signature (edges that list
    trusted keys load nothing else).
    """
    keys.check_name("model name", model)
    keys.check_name("version", version)
    path = local_source(source)
    files: list[ManifestFile] | None = None
    if path is not None and path.is_dir():
        path = path.resolve()
        files = await anyio.to_thread.run_sync(build_manifest, path, progress)
        digest, size = manifest_digest(files), sum(f.size for f in files)
        uri, base = url or str(path), path.name
        fmt = fmt or "hf"
    elif path is not None:
        path = path.resolve()
        if not path.is_file():
            raise SourceUnavailable(f"{source}: no such file or directory")
        digest = await anyio.to_thread.run_sync(sha256_file, path, progress)
        size = path.stat().st_size
        uri, base = url or str(path), path.name
    else:
        digest, size = await _hash_url(source, progress, client)
        uri = strip_url_credentials(source)
        base = unquote(urlsplit(source).path.rsplit("/", 1)[-1])
    name = keys.check_name("file name", filename or base)
    record = ArtifactRecord.model_validate(
        {
            "name": model,
            "version": version,
            "uri": uri,
            "filename": name,
            "sha256": digest,
            "size": size,
            "format": fmt or _FORMATS.get(Path(name).suffix.lower(), "gguf"),
            "files": None if files is None else [f.model_dump() for f in files],
            "tier": tier,
            "notes": notes,
            "created_by": store.actor,
        }
    )
    if signer is not None:
        record = signer.sign(record)
    if await store.register(record):
        await store.record("push", model=model, version=version, detail=f"{uri} {digest[:12]}")
    elif signer is not None:
        await _sign_existing(store, signer, record)
    return record


async def _sign_existing(store: SyncStore, signer: SigningKey, record: ArtifactRecord) -> None:
    """The identical artifact is registered already: sign its record if it says
    exactly what this push just hashed (pushing again with a key signs it)."""
    stored = await store.artifact(record.name, record.version)
    if stored is None or stored.signature == record.signature:  # ed25519 is deterministic
        return
    if signed_payload(stored) != signed_payload(record):
        raise ConflictError(
            f"{record.name} {record.version} is registered with other fields (uri {stored.uri}); "
            "not signed: push from that source, or check it and `model-sync sign` it"
        )
    await sign(store, signer, record.name, [record.version])


async def sign(
    store: SyncStore, signer: SigningKey, model: str, versions: list[str] | None = None
) -> list[ArtifactRecord]:
    """Sign registered versions of ``model`` (all of them without ``versions``) as they stand.

    For records pushed before signing was set up, and for a key rotation (the
    new key signs again what the old one signed). The signature vouches for
    what the registry holds now, so check the digests (`list`) first.
    """
    wanted = versions or [r.version for r in await store.artifacts(model)]
    if not wanted:
        raise ConflictError(f"{model} has no registered versions")
    signed: list[ArtifactRecord] = []
    for version in wanted:

        def change(current: ArtifactRecord | None, version: str = version) -> ArtifactRecord:
            if current is None:
                raise ConflictError(f"{model} {version} is not registered")
            return signer.sign(current)

        record = await store.update(keys.version_key(model, version), ArtifactRecord, change)
        assert record is not None
        signed.append(record)
        detail = f"key {signer.key_id} sha256 {record.sha256[:12]}"
        await store.record("sign", model=model, version=version, detail=detail)
    return signed


async def _hash_url(
    url: str, progress: ProgressFn | None, client: httpx.AsyncClient | None
) -> tuple[str, int]:
    digest = hashlib.sha256()
    size = 0
    own = client is None
    http = client or httpx.AsyncClient(timeout=httpx.Timeout(30.0, connect=10.0))
    try:
        async with http.stream("GET", url) as resp:
            if resp.status_code != 200:
                raise SourceUnavailable(f"GET {redact_url(url)}: HTTP {resp.status_code}")
            total = int(resp.headers.get("content-length") or 0)
            async for chunk in resp.aiter_bytes():
                digest.update(chunk)
                size += len(chunk)
                if progress:
                    progress(size, total or size)
    except httpx.HTTPError as exc:
        raise SourceUnavailable(f"GET {redact_url(url)}: {exc!r}") from None
    finally:
        if own:
            await http.aclose()
    return digest.hexdigest(), size


async def start_rollout(store: SyncStore, plan: RolloutPlan) -> RolloutState:
    """Write the plan and its initial state; refuses while another rollout is active."""
    marker = await store.read(keys.ACTIVE_ROLLOUT, ActiveRollout)
    if marker is not None:
        current = await store.state(marker[0].model)
        if current is not None and current.active and current.rollout_id == marker[0].rollout_id:
            raise ConflictError(
                f"rollout of {current.model} to {current.version} is {current.status}; "
                "abort it or wait for it to finish"
            )
    claim = ActiveRollout(model=plan.model, rollout_id=plan.id)
    if not await store.kv.put_if(keys.ACTIVE_ROLLOUT, claim.dump(), marker[1] if marker else 0):
        raise ConflictError("another rollout was started at the same moment; try again")
    await store.put(keys.plan_key(plan.model), plan)
    state = RolloutState(rollout_id=plan.id, model=plan.model, version=plan.version)
    await store.put(keys.rollout_state_key(plan.model), state)
    await store.set_alias(plan.model, "canary", plan.version)
    await store.record(
        "rollout-started",
        model=plan.model,
        version=plan.version,
        rollout_id=plan.id,
        detail=" → ".join(f"{w.name} ({len(w.nodes)})" for w in plan.waves),
    )
    return state


async def _steer(
    store: SyncStore, model: str, action: str, change: ChangeFn, detail: str = ""
) -> RolloutState:
    plan = await store.plan(model)

    def apply(state: RolloutState | None) -> RolloutState | None:
        if state is None or plan is None or not state.active:
            raise ConflictError(f"no active rollout of {model}")
        return change(state.model_copy(deep=True))

    result = await store.update(keys.rollout_state_key(model), RolloutState, apply)
    assert result is not None
    await store.record(
        action, model=model, version=result.version, rollout_id=result.rollout_id, detail=detail
    )
    return result


async def pause(store: SyncStore, model: str) -> RolloutState:
    def change(s: RolloutState) -> RolloutState:
        if s.status != "running":
            raise ConflictError(f"rollout of {model} is {s.status}, not running")
        s.status, s.reason = "paused", f"paused by {store.actor}"
        return s

    return await _steer(store, model, "pause", change)


async def resume(store: SyncStore, model: str) -> RolloutState:
    def change(s: RolloutState) -> RolloutState:
        if s.status != "paused":
            raise ConflictError(f"rollout of {model} is {s.status}, not paused")
        s.status, s.reason = "running", ""
        if s.step in ("bake", "gate"):
            s.step = "converge"  # bake the wave again before judging it
        return s

    return await _steer(store, model, "resume", change)


async def promote(store: SyncStore, model: str, *, full: bool = False) -> RolloutState:
    """Pass the current wave's gate now (``full``: every remaining gate too)."""

    def change(s: RolloutState) -> RolloutState:
        if s.status not in ("running", "paused"):
            raise ConflictError(f"rollout of {model} is {s.status}")
        s.status, s.reason = "running", ""
        s.force_pass = True
        s.skip_gates = s.skip_gates or full
        return s

    return await _steer(store, model, "promote", change, "all remaining waves" if full else "")


async def abort(store: SyncStore, model: str, reason: str = "") -> RolloutState:
    """Stop the rollout and send every node it touched back to its previous version."""

    def change(s: RolloutState) -> RolloutState:
        if s.status == "rolling_back":
            raise ConflictError(f"rollout of {model} is already rolling back")
        s.status, s.step = "rolling_back", "apply"
        s.rollback_status = "aborted"
        s.reason = reason or f"aborted by {store.actor}"
        return s

    return await _steer(store, model, "abort", change, reason)


async def rollback(store: SyncStore, model: str, to_version: str | None = None) -> str:
    """Put every node of ``model`` back on the last good version (or ``to_version``) now.

    An active rollout of the model is aborted instead. Returns the version.
    """
    state = await store.state(model)
    if state is not None and state.active:
        await abort(store, model, f"rollback requested by {store.actor}")
        plan = await store.plan(model)
        return plan.from_version if plan else ""
    target = to_version or await store.alias(model, "previous")
    if not target:
        raise ConflictError(f"no previous version of {model} is known; name one with --to")
    if await store.artifact(model, target) is None:
        raise ConflictError(f"{model} {target} is not registered")
    nodes = [n for n, (d, a) in (await store.nodes()).items() if _serves(model, d, a)]
    for node in nodes:
        await store.set_desired(node, model, target)
    await store.set_traffic(model, {target: 1.0})
    stable = await store.alias(model, "stable")
    await store.set_alias(model, "stable", target)
    if stable and stable != target:
        await store.set_alias(model, "previous", stable)
    await store.record("rollback", model=model, version=target, nodes=sorted(nodes))
    return target


def _serves(model: str, desired: DesiredState | None, actual: ActualState | None) -> bool:
    return any(doc is not None and doc.model == model for doc in (desired, actual))
