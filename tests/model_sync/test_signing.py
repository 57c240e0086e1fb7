"""Signed version records: the operator signs, every edge verifies before it downloads.

Unit tests of :mod:`model_sync.signing`, then the real reconciler on the real
embedded registry (SQLite): a record altered after signing, an unsigned one,
one signed by another key are refused with nothing downloaded and the old
version serving; a valid one installs. Last, the operator's path end to end
through the ``model-sync`` CLI (keygen, push, sign).
"""

from __future__ import annotations

import stat
from pathlib import Path

import anyio
import pytest

from model_sync import keys, ops
from model_sync.agent import ReconcilerSettings
from model_sync.records import ArtifactRecord
from model_sync.settings import load
from model_sync.signing import (
    RecordVerifier,
    SigningKey,
    UntrustedRecord,
    generate_keypair,
    public_key_text,
)
from model_sync.store import ConflictError, SyncStore
from servekit.config import ConfigError
from servekit.registry import Registry
from tests.model_sync.helpers import make_artifact, record_for
from tests.model_sync.test_agent import RecordingSwap, reconciler, running, wait_actual
from tests.model_sync.test_cli import cli, cli_json, embedded

pytestmark = pytest.mark.anyio

OTHER_SHA = "0" * 64


def new_key(tmp: Path, name: str = "operator") -> tuple[SigningKey, str]:
    private, public = generate_keypair(tmp / "keys", name)
    return SigningKey.from_pem(private.read_text()), public.read_text().strip()


def record(tmp: Path) -> ArtifactRecord:
    data, _ = make_artifact(tmp / "src" / "v2" / "m.gguf", 50_000)
    return record_for("tiny", "v2", str(tmp / "src" / "v2" / "m.gguf"), data)


# -- unit --------------------------------------------------------------------------


def test_a_signed_record_verifies_and_survives_the_registry_round_trip(tmp_path: Path) -> None:
    key, public = new_key(tmp_path)
    signed = key.sign(record(tmp_path))
    stored = ArtifactRecord.model_validate_json(signed.dump())
    assert RecordVerifier([public]).verify(stored) == key.key_id
    assert stored.signed_by == key.key_id


@pytest.mark.parametrize(
    "change",
    [
        {"sha256": OTHER_SHA},
        {"tier": "center"},
        {"size": 1},
        {"uri": "https://elsewhere.example/m.gguf"},
        {"filename": "other.gguf"},
        {"format": "hf"},
        {"version": "v3"},
    ],
)
def test_a_record_altered_after_signing_is_refused(
    tmp_path: Path, change: dict[str, object]
) -> None:
    key, public = new_key(tmp_path)
    altered = key.sign(record(tmp_path)).model_copy(update=change)
    with pytest.raises(UntrustedRecord, match="does not match the record"):
        RecordVerifier([public]).verify(altered)


def test_descriptive_fields_are_not_signed(tmp_path: Path) -> None:
    key, public = new_key(tmp_path)
    edited = key.sign(record(tmp_path)).model_copy(update={"notes": "edited", "created_at": 1.0})
    RecordVerifier([public]).verify(edited)


def test_unsigned_and_foreign_records_are_refused(tmp_path: Path) -> None:
    _, public = new_key(tmp_path)
    other, _ = new_key(tmp_path, "other")
    verifier = RecordVerifier([public])
    with pytest.raises(UntrustedRecord, match="not signed"):
        verifier.verify(record(tmp_path))
    with pytest.raises(UntrustedRecord, match=f"key {other.key_id}, which this node does not"):
        verifier.verify(other.sign(record(tmp_path)))
    # A foreign signature relabelled with the trusted key's id does not pass either.
    forged = other.sign(record(tmp_path)).model_copy(
        update={"signed_by": verifier.keys.popitem()[0]}
    )
    with pytest.raises(UntrustedRecord, match="does not match"):
        RecordVerifier([public]).verify(forged)


def test_rotation_trusts_every_listed_key(tmp_path: Path) -> None:
    old, old_public = new_key(tmp_path, "old")
    new, new_public = new_key(tmp_path, "new")
    both = RecordVerifier([old_public, new_public])
    assert both.verify(old.sign(record(tmp_path))) == old.key_id
    assert both.verify(new.sign(record(tmp_path))) == new.key_id


def test_keygen_writes_a_private_key_only_its_owner_reads(tmp_path: Path) -> None:
    private, public = generate_keypair(tmp_path / "keys")
    assert stat.S_IMODE(private.stat().st_mode) == 0o600
    key = SigningKey.from_pem(private.read_text())
    assert public.read_text().strip() == public_key_text(key.public)
    assert "PRIVATE" not in repr(key)
    with pytest.raises(FileExistsError):
        generate_keypair(tmp_path / "keys")


def test_trusted_keys_are_checked_when_settings_load(tmp_path: Path) -> None:
    _, public = new_key(tmp_path)
    keys_file = tmp_path / "trusted"
    keys_file.write_text(f"# operator, 2026\n{public}\n")
    assert ReconcilerSettings.model_validate(
        {"trusted_keys_file": str(keys_file)}
    ).trusted_keys == [public]
    with pytest.raises(ValueError, match="must look like ed25519:"):
        ReconcilerSettings.model_validate({"trusted_keys": ["ssh-ed25519 AAAA"]})
    with pytest.raises(ValueError, match="32"):
        ReconcilerSettings.model_validate({"trusted_keys": ["ed25519:AAAA"]})


def test_the_signing_key_is_a_secret_setting(tmp_path: Path) -> None:
    private, _ = generate_keypair(tmp_path / "keys")
    cfg = load(None, None, **{"signing.key_file": str(private)})
    key = cfg.signing.signing_key()
    assert key is not None
    assert "PRIVATE" not in repr(cfg)
    assert "PRIVATE" not in cfg.model_dump_json()
    with pytest.raises(ConfigError, match="signing"):
        load(None, None, **{"signing.key_file": str(tmp_path / "missing.key")})


# -- the real reconciler on the real embedded registry -----------------------------


async def publish(store: SyncStore, tmp: Path, key: SigningKey | None) -> ArtifactRecord:
    data, _ = make_artifact(tmp / "src" / "v2" / "m.gguf", 200_000)
    rec = record_for("tiny", "v2", str(tmp / "src" / "v2" / "m.gguf"), data)
    rec = key.sign(rec) if key is not None else rec
    await store.register(rec)
    return rec


async def refused(tmp: Path, registry: Registry, trusted: str, error: str) -> None:
    """Desire v2 on a node that trusts ``trusted``: it must fail naming ``error``."""
    store = SyncStore(registry)
    swap = RecordingSwap()
    rec = reconciler(registry, tmp, swap, verifier=RecordVerifier([trusted]))
    async with running(rec):
        await store.set_desired("edge-1", "tiny", "v2")
        actual = await wait_actual(store, "edge-1", lambda a: a.state == "failed")
    assert swap.calls == []
    assert actual.version == "v1"  # still serving the old one
    assert actual.target == "v2"
    assert actual.error is not None
    assert actual.error.startswith("UntrustedRecord: ")
    assert error in actual.error
    assert not (tmp / "models" / "tiny" / "v2").exists()  # nothing downloaded
    assert not any((tmp / "models").rglob("*.part"))


@pytest.mark.parametrize("change", [{"sha256": OTHER_SHA}, {"tier": "center"}])
async def test_reconciler_refuses_a_record_altered_after_signing(
    tmp_path: Path, registry: Registry, change: dict[str, object]
) -> None:
    key, public = new_key(tmp_path)
    rec = await publish(SyncStore(registry), tmp_path, key)
    # Someone with registry write access rewrites the stored record.
    await registry.put(keys.version_key("tiny", "v2"), rec.model_copy(update=change).dump())
    await refused(tmp_path, registry, public, "does not match the record")


async def test_reconciler_refuses_an_unsigned_record(tmp_path: Path, registry: Registry) -> None:
    _, public = new_key(tmp_path)
    await publish(SyncStore(registry), tmp_path, None)
    await refused(tmp_path, registry, public, "tiny v2 is not signed")


async def test_reconciler_refuses_a_record_signed_by_another_key(
    tmp_path: Path, registry: Registry
) -> None:
    _, public = new_key(tmp_path)
    other, _ = new_key(tmp_path, "intruder")
    await publish(SyncStore(registry), tmp_path, other)
    await refused(tmp_path, registry, public, f"signed by key {other.key_id}")


async def test_reconciler_refuses_an_installed_copy_of_an_untrusted_record(
    tmp_path: Path, registry: Registry
) -> None:
    """A version already on disk (its files verified once) is not reused either."""
    _, public = new_key(tmp_path)
    store = SyncStore(registry)
    await publish(store, tmp_path, None)
    async with running(reconciler(registry, tmp_path, RecordingSwap())):
        await store.set_desired("edge-1", "tiny", "v2")
        await wait_actual(store, "edge-1", lambda a: a.version == "v2")
    assert (tmp_path / "models" / "tiny" / "v2" / "model.gguf").is_file()
    # The node restarts on v1, now trusting a key; desired still names v2.
    swap = RecordingSwap()
    async with running(reconciler(registry, tmp_path, swap, verifier=RecordVerifier([public]))):
        actual = await wait_actual(store, "edge-1", lambda a: a.state == "failed")
    assert swap.calls == []
    assert actual.version == "v1"
    assert actual.error is not None
    assert "not signed" in actual.error


async def test_reconciler_installs_a_validly_signed_record(
    tmp_path: Path, registry: Registry
) -> None:
    key, public = new_key(tmp_path)
    store = SyncStore(registry)
    rec = await publish(store, tmp_path, key)
    swap = RecordingSwap()
    async with running(reconciler(registry, tmp_path, swap, verifier=RecordVerifier([public]))):
        await store.set_desired("edge-1", "tiny", "v2")
        actual = await wait_actual(store, "edge-1", lambda a: a.version == "v2")
    assert actual.state == "serving"
    assert actual.error is None
    assert swap.calls == [("v2", rec.sha256)]


async def test_without_trusted_keys_nothing_changes_but_it_says_so(
    tmp_path: Path, registry: Registry, caplog: pytest.LogCaptureFixture
) -> None:
    store = SyncStore(registry)
    await publish(store, tmp_path, None)
    swap = RecordingSwap()
    async with running(reconciler(registry, tmp_path, swap)):
        await store.set_desired("edge-1", "tiny", "v2")
        await wait_actual(store, "edge-1", lambda a: a.version == "v2")
    warnings = [r for r in caplog.records if "not verified" in r.getMessage()]
    assert len(warnings) == 1


# -- the operator's path: the CLI ---------------------------------------------------


async def test_cli_keygen_push_and_sign_make_records_an_edge_accepts(tmp_path: Path) -> None:
    async with embedded(tmp_path) as (registry, config):
        made = await cli_json(config, "keygen", "--out", str(tmp_path / "keys"))
        key_file = Path(made["private_key_file"])
        assert stat.S_IMODE((await anyio.Path(key_file).stat()).st_mode) == 0o600
        verifier = RecordVerifier([made["public_key"]])
        pem = await anyio.Path(key_file).read_text()
        body = pem.strip().splitlines()[1]

        make_artifact(tmp_path / "art" / "v1.gguf", 10_000)
        make_artifact(tmp_path / "art" / "v2.gguf", 10_000)
        # v1 pushed before signing was set up: unsigned, and the CLI says so.
        _, _, err = await cli(
            config, "push", str(tmp_path / "art" / "v1.gguf"), "--model", "m", "--version", "v1"
        )
        assert "not signed" in err
        _, out, err = await cli(
            config,
            "--signing-key-file",
            str(key_file),
            "push",
            str(tmp_path / "art" / "v2.gguf"),
            "--model",
            "m",
            "--version",
            "v2",
        )
        assert body not in out + err
        store = SyncStore(registry)
        v2 = await store.artifact("m", "v2")
        assert v2 is not None
        assert verifier.verify(v2)
        v1 = await store.artifact("m", "v1")
        assert v1 is not None
        with pytest.raises(UntrustedRecord):
            verifier.verify(v1)

        _, out, err = await cli(config, "--signing-key-file", str(key_file), "sign", "m", "v1")
        assert "signed m v1" in out
        assert body not in out + err
        v1 = await store.artifact("m", "v1")
        assert v1 is not None
        assert verifier.verify(v1)
        assert [e.action for e in await store.history("m")].count("sign") == 1
        code, _, err = await cli(config, "sign", "m", check=False)
        assert code == 1
        assert "needs a key" in err


async def test_pushing_again_with_a_key_signs_what_it_hashed(
    tmp_path: Path, registry: Registry
) -> None:
    key, public = new_key(tmp_path)
    store = SyncStore(registry)
    make_artifact(tmp_path / "art" / "m.gguf", 10_000)
    source = str(tmp_path / "art" / "m.gguf")
    await ops.push(store, source, model="m", version="v1")
    await ops.push(store, source, model="m", version="v1", signer=key)
    stored = await store.artifact("m", "v1")
    assert stored is not None
    assert RecordVerifier([public]).verify(stored) == key.key_id
    # The same bytes from another place: the record names another uri, so it is not signed.
    other = tmp_path / "elsewhere" / "m.gguf"
    other.parent.mkdir()
    other.write_bytes((tmp_path / "art" / "m.gguf").read_bytes())
    await ops.push(store, str(other), model="m", version="v2")
    with pytest.raises(ConflictError, match="registered with other fields"):
        await ops.push(store, source, model="m", version="v2", signer=key)


async def test_sign_refuses_an_unknown_version(tmp_path: Path, registry: Registry) -> None:
    key, _ = new_key(tmp_path)
    with pytest.raises(ConflictError, match="not registered"):
        await ops.sign(SyncStore(registry), key, "tiny", ["v9"])


async def test_a_reload_trusts_added_keys_and_retries_what_they_sign(
    tmp_path: Path, registry: Registry, caplog: pytest.LogCaptureFixture
) -> None:
    """Rotation without a restart: a version signed by the operator's next key fails on a
    node that trusts only the current one, and installs once a reload adds the next."""
    current, current_public = new_key(tmp_path)
    following, following_public = new_key(tmp_path, "next")
    store = SyncStore(registry)
    rec = await publish(store, tmp_path, following)
    swap = RecordingSwap()
    node = reconciler(registry, tmp_path, swap, verifier=RecordVerifier([current_public]))
    async with running(node):
        await store.set_desired("edge-1", "tiny", "v2")
        await wait_actual(store, "edge-1", lambda a: a.state == "failed")
        node.trust([current_public, following_public])  # as the edge's SIGHUP reload does
        await wait_actual(store, "edge-1", lambda a: a.version == "v2")
        node.trust([following_public])  # the current key retired
        node.trust([])  # would turn verification off: refused
    assert swap.calls == [("v2", rec.sha256)]
    assert node.verifier is not None
    assert set(node.verifier.keys) == {following.key_id}
    said = [r.getMessage() for r in caplog.records if r.name == "model_sync.agent"]
    assert any(f"added {following.key_id}, removed none" in m for m in said), said
    assert any(f"added none, removed {current.key_id}" in m for m in said), said
    assert any("would stop verifying version records" in m for m in said), said
