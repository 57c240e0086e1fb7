"""Operator signatures on version records (ed25519), so registry write access
alone does not choose what every edge loads.

The operator holds a private key (``model-sync keygen``); ``push`` and
``sign`` put a signature over the record's canonical encoding into the record
(``signature``, and ``signed_by``: the key's id). Each edge lists the public
keys it trusts (``model_sync.trusted_keys``) and verifies a record before a
byte is downloaded; a record without a signature, with a bad one or one made
by a key it does not trust is refused (:class:`UntrustedRecord`).

What is signed is every field that decides what runs and where it comes
from: name, version, uri, filename, sha256, size, files, format and tier
(:func:`signed_payload`). ``uri`` is included although the content is already
bound by the signed digest: the URI decides where a node sends its artifact
credentials (bearer token, client certificate) and which local file it
reads, so a registry writer who could change it could collect every edge's
artifact token on a host of their choosing. ``notes``, ``created_by`` and
``created_at`` only describe the record and are left out.

Keys are text: a private key is a PKCS#8 PEM file (mode 0600), a public key
one line, ``ed25519:<base64 of the 32 raw bytes>``; its id is the first 16
hex digits of the raw key's sha256.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import json
import os
from collections.abc import Iterable
from pathlib import Path

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

from model_sync.keys import check_name
from model_sync.records import ArtifactRecord

__all__ = [
    "PUBLIC_KEY_PREFIX",
    "RecordVerifier",
    "SigningKey",
    "UntrustedRecord",
    "generate_keypair",
    "key_id",
    "parse_public_key",
    "public_key_text",
    "signed_payload",
]

PUBLIC_KEY_PREFIX = "ed25519:"
# Domain separation: a signature over a version record is never valid as anything else.
_CONTEXT = b"hybrid-llm model_sync version record v1\n"


class UntrustedRecord(Exception):
    """A version record an edge refuses: unsigned, altered, or signed by an untrusted key."""


def _raw(public: Ed25519PublicKey) -> bytes:
    return public.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)


def key_id(public: Ed25519PublicKey) -> str:
    """A short, stable name for a public key (what a record's ``signed_by`` holds)."""
    return hashlib.sha256(_raw(public)).hexdigest()[:16]


def public_key_text(public: Ed25519PublicKey) -> str:
    """The one-line form an edge's ``trusted_keys`` lists."""
    return PUBLIC_KEY_PREFIX + base64.b64encode(_raw(public)).decode()


def parse_public_key(text: str) -> Ed25519PublicKey:
    """Read ``ed25519:<base64>``; :class:`ValueError` names what is wrong."""
    value = text.strip()
    if not value.startswith(PUBLIC_KEY_PREFIX):
        raise ValueError(f"a trusted key must look like {PUBLIC_KEY_PREFIX}<base64>, got {text!r}")
    try:
        raw = base64.b64decode(value.removeprefix(PUBLIC_KEY_PREFIX), validate=True)
    except binascii.Error:
        raise ValueError(f"trusted key {text!r} is not valid base64") from None
    if len(raw) != 32:
        raise ValueError(f"trusted key {text!r} is {len(raw)} bytes, an ed25519 key is 32")
    return Ed25519PublicKey.from_public_bytes(raw)


def signed_payload(record: ArtifactRecord) -> bytes:
    """The canonical bytes a signature covers (compact JSON, sorted keys)."""
    files = None
    if record.files is not None:
        files = [[f.path, f.size, f.sha256] for f in sorted(record.files, key=lambda f: f.path)]
    fields = {
        "name": record.name,
        "version": record.version,
        "uri": record.uri,
        "filename": record.filename,
        "sha256": record.sha256,
        "size": record.size,
        "files": files,
        "format": record.format,
        "tier": record.tier,
    }
    return _CONTEXT + json.dumps(fields, sort_keys=True, separators=(",", ":")).encode()


class SigningKey:
    """The operator's private key; :meth:`sign` returns a signed copy of a record."""

    def __init__(self, private: Ed25519PrivateKey) -> None:
        self._private = private
        self.public = private.public_key()
        self.key_id = key_id(self.public)

    @classmethod
    def from_pem(cls, pem: str) -> SigningKey:
        try:
            key = serialization.load_pem_private_key(pem.strip().encode(), password=None)
        except (ValueError, TypeError):
            raise ValueError("the signing key is not an unencrypted PEM private key") from None
        if not isinstance(key, Ed25519PrivateKey):
            raise ValueError("the signing key is not an ed25519 key")
        return cls(key)

    def sign(self, record: ArtifactRecord) -> ArtifactRecord:
        signature = self._private.sign(signed_payload(record))
        return record.model_copy(
            update={"signature": base64.b64encode(signature).decode(), "signed_by": self.key_id}
        )

    def __repr__(self) -> str:  # never the key itself
        return f"SigningKey(key_id={self.key_id!r})"


class RecordVerifier:
    """The public keys an edge trusts; :meth:`verify` passes a record or says why not."""

    def __init__(self, trusted: Iterable[str]) -> None:
        keys = [parse_public_key(text) for text in trusted]
        if not keys:
            raise ValueError("no trusted keys given")
        self.keys = {key_id(k): k for k in keys}

    def verify(self, record: ArtifactRecord) -> str:
        """The id of the trusted key that signed ``record``; else :class:`UntrustedRecord`."""
        what = f"{record.name} {record.version}"
        if not record.signature:
            raise UntrustedRecord(f"{what} is not signed; this node accepts only signed versions")
        public = self.keys.get(record.signed_by)
        if public is None:
            raise UntrustedRecord(
                f"{what} is signed by key {record.signed_by or '?'}, which this node does not "
                f"trust (trusted: {', '.join(sorted(self.keys))})"
            )
        try:
            signature = base64.b64decode(record.signature, validate=True)
            public.verify(signature, signed_payload(record))
        except (binascii.Error, InvalidSignature):
            raise UntrustedRecord(
                f"{what}: the signature does not match the record (changed after signing?)"
            ) from None
        return record.signed_by


def generate_keypair(out_dir: Path, name: str = "operator") -> tuple[Path, Path]:
    """Write ``<name>.key`` (PEM, mode 0600) and ``<name>.pub`` into ``out_dir``.

    Refuses to overwrite an existing key (:class:`FileExistsError`).
    """
    check_name("key name", name)
    out_dir.mkdir(parents=True, exist_ok=True)
    private_path, public_path = out_dir / f"{name}.key", out_dir / f"{name}.pub"
    if public_path.exists():
        raise FileExistsError(f"{public_path} exists; remove it or choose another --name")
    private = Ed25519PrivateKey.generate()
    pem = private.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )
    # Created with 0600 from the start: never readable by others, not even briefly.
    fd = os.open(private_path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(pem)
    public_path.write_text(public_key_text(private.public_key()) + "\n", encoding="utf-8")
    return private_path, public_path
