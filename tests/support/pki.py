"""Certificates made in the test: a private CA, server and client certificates (trustme).

Files are written under a temporary directory, as a deployment would have
them: the CA bundle, each service's chain + key.
"""

from __future__ import annotations

import ssl
from dataclasses import dataclass
from pathlib import Path

import trustme


@dataclass(frozen=True)
class Issued:
    cert_file: Path  # the certificate chain, leaf first
    key_file: Path


class PrivateCA:
    """One certificate authority; ``ca_file`` is what clients (or mTLS servers) trust."""

    def __init__(self, directory: Path, name: str = "fleet") -> None:
        directory.mkdir(parents=True, exist_ok=True)
        self._dir = directory
        self._name = name
        self.ca = trustme.CA(organization_name=f"hybrid-llm {name} test CA")
        self.ca_file = directory / f"{name}-ca.pem"
        self.ca.cert_pem.write_to_path(str(self.ca_file))
        self._serial = 0

    def issue(self, *names: str) -> Issued:
        """A certificate for ``names`` (hosts or IP addresses), for a server or a client."""
        self._serial += 1
        cert = self.ca.issue_cert(*(names or ("127.0.0.1", "localhost")))
        stem = self._dir / f"{self._name}-{self._serial}"
        cert_file, key_file = stem.with_suffix(".pem"), stem.with_suffix(".key")
        with cert_file.open("wb") as fh:
            for blob in cert.cert_chain_pems:
                fh.write(blob.bytes())
        cert.private_key_pem.write_to_path(str(key_file))
        return Issued(cert_file, key_file)

    def client_context(self) -> ssl.SSLContext:
        ctx = ssl.create_default_context(cafile=str(self.ca_file))
        return ctx
