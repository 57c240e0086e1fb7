"""TLS for every hop: a service's certificate, and what its clients trust.

Server side (``server.tls`` in a service's settings): a certificate chain and
its key, optionally a client CA (then every caller must present a
certificate it signed: mutual TLS). :func:`server_context` builds the
``SSLContext`` the service listens with; :func:`reload_server_context`
loads new files *into the same context*, so connections (and streams)
already open keep going while every new handshake gets the new certificate.
``servekit.serve`` does that on SIGHUP.

Client side: :func:`client_context` verifies the server against a CA bundle
(the system's trust store when none is given) and presents a client
certificate when one is configured. Hostname checking stays on: a
certificate must name the host the URL names. Nothing here ever falls back
to plain text; a verification failure is an error.
"""

from __future__ import annotations

import ssl
from pathlib import Path
from typing import Literal

from pydantic import Field, SecretStr, model_validator

from servekit.secrets import SecretSettings

__all__ = [
    "ServerTLSSettings",
    "client_ca_change",
    "client_context",
    "describe_tls_error",
    "reload_server_context",
    "server_context",
]

_VERSIONS = {"TLSv1.2": ssl.TLSVersion.TLSv1_2, "TLSv1.3": ssl.TLSVersion.TLSv1_3}


class ServerTLSSettings(SecretSettings):
    """Serve HTTPS with this certificate (``server.tls``)."""

    secret_fields = ("key_password",)
    cert_file: Path = Field(description="PEM certificate chain, the service's own first.")
    key_file: Path = Field(description="PEM private key of the certificate.")
    key_password: SecretStr | None = Field(
        None, description="Passphrase of an encrypted key (or key_password_file / _env)."
    )
    client_ca_file: Path | None = Field(
        None, description="Require client certificates signed by this CA bundle (mutual TLS)."
    )
    min_version: Literal["TLSv1.2", "TLSv1.3"] = "TLSv1.2"

    @model_validator(mode="after")
    def _loadable(self) -> ServerTLSSettings:
        # Fail at start, naming the files, rather than at the first handshake.
        server_context(self)
        return self


def _password(secret: SecretStr | None) -> str | None:
    return secret.get_secret_value() if secret is not None else None


def _load_chain(
    ctx: ssl.SSLContext, cert: Path, key: Path | None, password: SecretStr | None
) -> None:
    try:
        ctx.load_cert_chain(cert, key, _password(password))
    except FileNotFoundError as exc:
        raise ValueError(f"cannot read {exc.filename}: {exc.strerror}") from None
    except ssl.SSLError as exc:
        raise ValueError(
            f"cannot load certificate {cert} with key {key}: {exc.reason or exc}"
        ) from None


def _load_ca(ctx: ssl.SSLContext, ca: Path) -> None:
    try:
        ctx.load_verify_locations(cafile=ca)
    except FileNotFoundError as exc:
        raise ValueError(f"cannot read CA bundle {ca}: {exc.strerror}") from None
    except ssl.SSLError as exc:
        raise ValueError(f"not a PEM CA bundle: {ca}: {exc.reason or exc}") from None


def server_context(tls: ServerTLSSettings) -> ssl.SSLContext:
    """The listening context for ``tls``; ``ValueError`` names a file that does not load."""
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.minimum_version = _VERSIONS[tls.min_version]
    _load_chain(ctx, tls.cert_file, tls.key_file, tls.key_password)
    if tls.client_ca_file is not None:
        ctx.verify_mode = ssl.CERT_REQUIRED
        _load_ca(ctx, tls.client_ca_file)
    return ctx


def client_ca_change(
    running: ServerTLSSettings | None, fresh: ServerTLSSettings | None
) -> str | None:
    """Why a reload from ``running`` to ``fresh`` cannot apply its client-CA setting
    (None: it can). A live context neither starts nor stops requiring client
    certificates; a renewed CA bundle in the same place is fine."""
    before = running is not None and running.client_ca_file is not None
    after = fresh is not None and fresh.client_ca_file is not None
    if after and not before:
        return "it adds server.tls.client_ca_file; requiring client certificates needs a restart"
    if before and not after:
        return "it drops server.tls.client_ca_file; accepting any client needs a restart"
    return None


def reload_server_context(ctx: ssl.SSLContext, tls: ServerTLSSettings) -> None:
    """Load ``tls``'s (renewed) files into the live ``ctx``: new handshakes use them.

    CA certificates can only be added to a live context, never removed;
    dropping a client CA needs a restart. A client CA for a context that does
    not require client certificates is refused (``ValueError``): loaded, it
    would be trusted while nothing is checked.
    """
    if tls.client_ca_file is not None and ctx.verify_mode != ssl.CERT_REQUIRED:
        raise ValueError(
            "server.tls.client_ca_file added on reload; requiring client certificates "
            "needs a restart"
        )
    _load_chain(ctx, tls.cert_file, tls.key_file, tls.key_password)
    if tls.client_ca_file is not None:
        _load_ca(ctx, tls.client_ca_file)


def client_context(
    ca_file: Path | None = None,
    cert_file: Path | None = None,
    key_file: Path | None = None,
    key_password: SecretStr | None = None,
) -> ssl.SSLContext:
    """Verify servers against ``ca_file`` (else the system store); present ``cert_file``."""
    ctx = ssl.create_default_context()
    if ca_file is not None:
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)  # only the private CA, not the system's
        _load_ca(ctx, ca_file)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    if cert_file is not None:
        _load_chain(ctx, cert_file, key_file, key_password)
    return ctx


def describe_tls_error(exc: BaseException) -> str | None:
    """A one-line reason when ``exc`` is (or was caused by) a failed TLS handshake."""
    seen: BaseException | None = exc
    for _ in range(8):  # httpx wraps httpcore's error, which wraps the ssl one
        if seen is None:
            return None
        if isinstance(seen, ssl.SSLCertVerificationError):
            return f"TLS certificate verification failed: {seen.verify_message or seen.reason}"
        if isinstance(seen, ssl.SSLError):
            return f"TLS handshake failed: {seen.reason or seen}"
        seen = seen.__cause__ or seen.__context__
    return None
