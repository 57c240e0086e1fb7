"""How one service calls another: its token, the CA it trusts, its client certificate.

Every client of another tier takes a :class:`PeerSettings` block (the
router's ``peers:``, the gateway's ``replica_client:``, model_sync's
``artifacts:``...)::

    token_file: $CREDENTIALS_DIRECTORY/service-token   # sent as Authorization: Bearer
    ca_file: /etc/hybrid-llm/tls/fleet-ca.pem          # verify https:// upstreams with it
    cert_file: /etc/hybrid-llm/tls/router.pem          # mutual TLS (optional)
    key_file: /etc/hybrid-llm/tls/router-key.pem
    require_tls: true                                  # refuse http:// upstreams
    identity: instance                                 # the certificate must name the role

:meth:`PeerSettings.credentials` turns it into a :class:`PeerCredentials`
(the ``SSLContext`` and the headers, built once) and :func:`async_client`
into an ``httpx.AsyncClient`` that carries both. A URL's scheme decides
whether TLS is used; nothing ever retries an ``https://`` upstream in clear
text, and with ``require_tls`` an ``http://`` one is refused before a byte
(the token included) is sent.

``identity`` says what an ``https://`` peer's certificate must name
(``servekit.peer_identity``): its URL's host (``host``, the default), or its
role, ``<tier>.<identity_domain>`` (``tier``) or
``<instance id>.<tier>.<identity_domain>`` (``instance``). A caller that
knows which peer it calls binds that name in with
:meth:`PeerCredentials.for_peer`; the TLS library checks it in the handshake
(sent as SNI), and a peer whose certificate does not carry it is never sent a
byte. A role can only be proven over TLS, so with ``tier`` or ``instance``
an ``http://`` peer is refused as with ``require_tls``.
"""

from __future__ import annotations

import dataclasses
import logging
import ssl
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
from pydantic import Field, SecretStr, field_validator

from servekit.peer_identity import (
    DEFAULT_DOMAIN,
    Identity,
    IdentityUnusable,
    check_domain,
    expected_name,
)
from servekit.secrets import SecretSettings
from servekit.tls import client_context, describe_tls_error

__all__ = [
    "IdentityRefused",
    "PeerCredentials",
    "PeerProblems",
    "PeerRefused",
    "PeerSettings",
    "PlainTextRefused",
    "async_client",
]


class PeerRefused(httpx.ConnectError):
    """A peer refused before connecting, as its settings say; nothing was sent.

    A connect error to httpx's callers (the peer is unusable as configured).
    """


class PlainTextRefused(PeerRefused):
    """An ``http://`` URL for a peer whose settings require TLS."""


class IdentityRefused(PeerRefused):
    """A peer whose identity cannot be checked (its id is no DNS label)."""


class PeerSettings(SecretSettings):
    """Credentials and trust for calling a peer service."""

    secret_fields = ("token", "key_password")
    token: SecretStr | None = Field(
        None, description="Bearer token sent to the peer (better: token_file or token_env)."
    )
    ca_file: Path | None = Field(
        None, description="CA bundle that https:// peers are verified against (default: system)."
    )
    cert_file: Path | None = Field(None, description="Client certificate (mutual TLS).")
    key_file: Path | None = Field(None, description="Key of the client certificate.")
    key_password: SecretStr | None = Field(None, description="Passphrase of an encrypted key.")
    require_tls: bool = Field(False, description="Refuse http:// peers (nothing is sent).")
    identity: Identity = Field(
        "host",
        description="What an https:// peer's certificate must name: the URL's host (host), "
        "<tier>.<identity_domain> (tier) or <instance id>.<tier>.<identity_domain> "
        "(instance). Only tier or instance proves the role of a peer found in a registry; "
        "both refuse http:// peers. Read by callers that know the peer's role (the "
        "router's peers); others check the host.",
    )
    identity_domain: str = Field(
        DEFAULT_DOMAIN, description="The domain of the names `identity` asks for."
    )

    @field_validator("identity_domain")
    @classmethod
    def _domain(cls, value: str) -> str:
        return check_domain(value)  # IdentityUnusable is a ValueError: names the field

    def credentials(self) -> PeerCredentials:
        """The context and headers these settings describe (build once, reuse)."""
        ctx = client_context(self.ca_file, self.cert_file, self.key_file, self.key_password)
        headers: dict[str, str] = {}
        if self.token is not None:
            headers["authorization"] = f"Bearer {self.token.get_secret_value()}"
        return PeerCredentials(ctx, headers, self.require_tls, self.identity, self.identity_domain)


@dataclass(frozen=True, eq=False)
class PeerCredentials:
    """A built :class:`PeerSettings`: hashable by identity, shared by connections."""

    ssl: ssl.SSLContext
    headers: dict[str, str] = field(default_factory=dict)
    require_tls: bool = False
    identity: Identity = "host"
    identity_domain: str = DEFAULT_DOMAIN
    server_name: str | None = None  # the name the certificate must carry (None: URL's host)
    unusable: str | None = None  # why no certificate can match this peer

    def for_peer(self, tier: str, instance_id: str) -> PeerCredentials:
        """These credentials for one peer, the name its certificate must carry bound in
        (themselves under ``identity: host``). Build once per peer and reuse: a
        connection pool keys its connections by credentials."""
        if self.identity == "host":
            return self
        try:
            name = expected_name(self.identity, self.identity_domain, tier, instance_id)
        except IdentityUnusable as exc:
            return dataclasses.replace(self, unusable=str(exc))
        return dataclasses.replace(self, server_name=name)

    def check_url(self, url: str) -> None:
        """Raise :class:`PeerRefused` for a URL these credentials must not call:
        ``http://`` when TLS is required or a role is to be checked, any URL of a
        peer whose identity cannot be checked."""
        if self.unusable is not None:
            raise IdentityRefused(f"refusing to call {url}: {self.unusable}")
        plain = not url.lower().startswith("https://")
        if plain and self.require_tls:
            raise PlainTextRefused(
                f"refusing to call {url} in plain text: this peer requires TLS (require_tls)"
            )
        if plain and self.identity != "host":
            raise PlainTextRefused(
                f"refusing to call {url} in plain text: its identity ({self.identity}) "
                "can only be checked over TLS"
            )


class PeerProblems:
    """Configuration problems with peers (a refused certificate or token), logged once.

    Probes run every second; a wrong CA bundle or token is not a blip, so it is
    logged as a warning the first time, and again only when the reason changes.
    """

    def __init__(self, logger: logging.Logger) -> None:
        self._log = logger
        self._last: dict[str, str] = {}

    def failed(self, url: str, exc: BaseException) -> None:
        """A request to ``url`` raised ``exc``: warn if it was a TLS failure."""
        reason = describe_tls_error(exc)
        if reason is not None:
            self._warn(url, f"{url}: {reason}")

    def status(self, url: str, status: int) -> None:
        """``url`` answered ``status``: warn if it refused our credentials."""
        if status in (401, 403):
            self._warn(url, f"{url} refused the service token (HTTP {status})")

    def _warn(self, url: str, problem: str) -> None:
        if self._last.get(url) != problem:
            self._last[url] = problem
            self._log.warning("%s", problem)


def _check_peer(credentials: PeerCredentials) -> Any:
    async def hook(request: httpx.Request) -> None:
        credentials.check_url(str(request.url))
        if credentials.server_name is not None:
            # httpcore sends it as SNI and verifies the certificate against it.
            request.extensions["sni_hostname"] = credentials.server_name

    return hook


def async_client(
    settings: PeerSettings | PeerCredentials | None = None, **kwargs: Any
) -> httpx.AsyncClient:
    """An ``httpx.AsyncClient`` that verifies, authenticates and refuses as ``settings`` say.

    ``kwargs`` go to httpx (timeouts, limits, base_url...); headers given there
    are merged under the peer's.
    """
    creds = settings.credentials() if isinstance(settings, PeerSettings) else settings
    if creds is None:
        return httpx.AsyncClient(**kwargs)
    headers = {**dict(kwargs.pop("headers", None) or {}), **creds.headers}
    hooks = dict(kwargs.pop("event_hooks", None) or {})
    hooks["request"] = [*hooks.get("request", []), _check_peer(creds)]
    return httpx.AsyncClient(verify=creds.ssl, headers=headers, event_hooks=hooks, **kwargs)
