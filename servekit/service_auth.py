"""Bearer tokens between services: who may call an edge agent, the gateway, the artifacts.

Tokens are kept only as sha256 digests. A presented token is hashed and
compared with :func:`hmac.compare_digest` against *every* accepted digest
(no early exit), so the time taken says nothing about how much of a digest
matched. Several tokens are accepted at once, which is how a token is
rotated: add the new one to every service, move the callers over, then
remove the old one. The router's API keys are checked with the same
:class:`DigestSet` (:mod:`geo_router.auth`).

:class:`ServiceAuth` is the ASGI middleware the services put outermost:
without a valid ``Authorization: Bearer <token>`` a request gets 401 in the
OpenAI error shape, except on ``/health`` and ``/ready`` (load balancers and
supervisors probe them) and, unless ``protect_metrics`` is set, ``/metrics``.
With no token configured the middleware lets everything through (a laptop
setup); services log a warning at start then, and refuse to start at all on
an address other machines reach unless ``server.allow_unauthenticated`` says
so (:func:`refuse_open_bind`).
"""

from __future__ import annotations

import hashlib
import hmac
import ipaddress
import logging
from collections.abc import Iterable

from pydantic import Field, SecretStr, field_validator

from servekit.asgi import ASGIApp, Receive, Scope, Send, send_json
from servekit.errors import AuthenticationFailed
from servekit.secrets import SecretSettings

__all__ = [
    "DigestSet",
    "ServiceAuth",
    "ServiceAuthSettings",
    "TokenGate",
    "bearer_token",
    "check_sha256_hex",
    "hash_token",
    "is_loopback",
    "refuse_open_bind",
    "warn_if_open",
]

log = logging.getLogger(__name__)

OPEN_PATHS = frozenset({"/health", "/ready"})
_REMEMBERED_MAX = 4096


def hash_token(token: str) -> str:
    """The stored form of a token or API key: hex sha256 of its UTF-8 bytes."""
    return hashlib.sha256(token.encode("utf-8")).hexdigest()


def bearer_token(header: str | None) -> str | None:
    """The token of an ``Authorization: Bearer <token>`` header, or None."""
    if not header:
        return None
    scheme, _, value = header.strip().partition(" ")
    if scheme.lower() != "bearer" or not value.strip():
        return None
    return value.strip()


class DigestSet:
    """Accepted sha256 digests; :meth:`match` compares against all of them.

    :meth:`match_header` remembers the ``Authorization`` headers that passed:
    hashing and comparing is cheap warm but tens of microseconds on the cold
    caches a service between bursts runs on, on every request. Only accepted
    headers are kept (a wrong token always takes the full comparison), and the
    lookup leaks nothing useful: strings are compared only after their
    per-process randomised hashes match, and a hit says what the answer says.
    """

    def __init__(self, hex_digests: Iterable[str]) -> None:
        self._digests = [bytes.fromhex(d) for d in hex_digests]
        self._accepted: dict[str, int] = {}

    def __len__(self) -> int:
        return len(self._digests)

    def match(self, token: str) -> int | None:
        """Index of the digest ``token`` hashes to, or None; constant time in the match."""
        presented = hashlib.sha256(token.encode("utf-8")).digest()
        found: int | None = None
        for index, stored in enumerate(self._digests):
            # No early exit: every digest is compared whatever matched before.
            if hmac.compare_digest(stored, presented):
                found = index
        return found

    def match_header(self, authorization: str | None) -> int | None:
        """:meth:`match` for an ``Authorization: Bearer`` header (None if absent or wrong)."""
        if authorization is None:
            return None
        known = self._accepted.get(authorization)
        if known is not None:
            return known
        token = bearer_token(authorization)
        found = None if token is None else self.match(token)
        if found is not None:
            if len(self._accepted) >= _REMEMBERED_MAX:
                self._accepted.clear()
            self._accepted[authorization] = found
        return found


def check_sha256_hex(value: str) -> str:
    """``value`` normalised, if it is a hex sha256 digest; ``ValueError`` otherwise."""
    value = value.strip().lower()
    if len(value) != 64 or any(c not in "0123456789abcdef" for c in value):
        raise ValueError("must be 64 hex digits (sha256 of the token)")
    return value


class ServiceAuthSettings(SecretSettings):
    """Tokens a service accepts (``server.auth``); any one of them admits a caller."""

    secret_fields = ("tokens",)
    tokens: list[SecretStr] = Field(
        default_factory=list,
        description="Accepted tokens (better: tokens_file, one per line, or tokens_env); "
        "hashed at start.",
    )
    sha256: list[str] = Field(
        default_factory=list, description="Accepted tokens as hex sha256 digests."
    )
    protect_metrics: bool = Field(False, description="Require a token on /metrics too.")

    @field_validator("sha256")
    @classmethod
    def _hex(cls, value: list[str]) -> list[str]:
        return [check_sha256_hex(v) for v in value]

    @property
    def enabled(self) -> bool:
        return bool(self.tokens or self.sha256)

    def digests(self) -> list[str]:
        return [*(hash_token(t.get_secret_value()) for t in self.tokens), *self.sha256]


class TokenGate:
    """The accepted tokens of one service; :meth:`update` swaps them (settings reload)."""

    def __init__(self, settings: ServiceAuthSettings | None = None) -> None:
        self.update(settings or ServiceAuthSettings())

    def update(self, settings: ServiceAuthSettings) -> None:
        self._digests = DigestSet(settings.digests())
        self.enabled = settings.enabled
        self.protect_metrics = settings.protect_metrics

    def is_open(self, path: str) -> bool:
        return (
            not self.enabled
            or path in OPEN_PATHS
            or (path == "/metrics" and not self.protect_metrics)
        )

    def check(self, authorization: str | None) -> None:
        """Raise :class:`AuthenticationFailed` unless the header carries an accepted token."""
        if self._digests.match_header(authorization) is not None:
            return
        if bearer_token(authorization) is None:
            raise AuthenticationFailed(
                "missing service token: send 'Authorization: Bearer <token>'",
                code="missing_api_key",
            )
        raise AuthenticationFailed("invalid service token")


def _authorization(scope: Scope) -> str | None:
    for key, value in scope.get("headers", ()):
        if key == b"authorization":
            return bytes(value).decode("latin-1")
    return None


class ServiceAuth:
    """ASGI middleware: 401 (OpenAI shape) for requests without an accepted token."""

    def __init__(self, app: ASGIApp, gate: TokenGate) -> None:
        self.app = app
        self.gate = gate

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or self.gate.is_open(scope["path"]):
            await self.app(scope, receive, send)
            return
        try:
            self.gate.check(_authorization(scope))
        except AuthenticationFailed as exc:
            headers = {"WWW-Authenticate": 'Bearer realm="hybrid-llm"'}
            await send_json(send, exc.status, exc.body(), headers)
            return
        await self.app(scope, receive, send)


def is_loopback(host: str) -> bool:
    """Whether ``host`` (an address to bind) is reachable from this machine only."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False  # a name: it may resolve to anything


def warn_if_open(gate: TokenGate, service: str, host: str, port: int) -> None:
    """Say so at start when a service answers anyone who reaches its port."""
    if not gate.enabled:
        log.warning(
            "%s on %s:%d accepts requests without a service token (no server.auth tokens)",
            service,
            host,
            port,
        )


def refuse_open_bind(host: str, open_because: str | None, allowed: bool) -> None:
    """``ValueError`` when a service would answer anyone on a non-loopback ``host``.

    ``open_because`` says why it takes unauthenticated calls (None: it does
    not); ``allowed`` is ``server.allow_unauthenticated``. Loopback stays
    allowed: only this machine reaches it (:func:`warn_if_open` says so).
    """
    if open_because is None or allowed or is_loopback(host):
        return
    raise ValueError(
        f"refusing to listen on {host} without authentication ({open_because}): "
        "anyone who reaches the port could call it; configure authentication, listen on "
        "127.0.0.1, or set server.allow_unauthenticated: true to run it open on purpose"
    )
