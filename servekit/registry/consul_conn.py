"""Where and how to reach the Consul agent: settings first, then ``CONSUL_*``.

The address should be the agent on the instance's own host
(``127.0.0.1:8500``, the agent's ``client_addr``): agent endpoints
(registration, heartbeats, ``/v1/agent/self``) act on the agent that answers,
so a load balancer or a remote server in front of several agents scatters one
instance's heartbeats across nodes.
"""

from __future__ import annotations

import os
import urllib.parse
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from servekit.registry.protocol import RegistryError
from servekit.registry.settings import ConsulSettings

__all__ = ["ConsulConnection", "resolve_connection"]


@dataclass(frozen=True, slots=True)
class ConsulConnection:
    """Where and how to reach the agent, after settings and environment."""

    host: str
    port: int
    scheme: str
    token: str | None
    verify: bool | str
    cert: tuple[str, str] | str | None


def resolve_connection(
    settings: ConsulSettings, environ: Mapping[str, str] | None = None
) -> ConsulConnection:
    """Settings first, then the ``CONSUL_*`` environment variables, then defaults.

    The ACL token: ``consul.token`` (or ``token_file`` / ``token_env``), then
    ``$CONSUL_HTTP_TOKEN``, then the file ``$CONSUL_HTTP_TOKEN_FILE`` names.
    """
    env = os.environ if environ is None else environ
    address = settings.address or env.get("CONSUL_HTTP_ADDR") or "127.0.0.1:8500"
    parsed = urllib.parse.urlparse(address if "//" in address else "//" + address)
    try:
        port = parsed.port
    except ValueError as exc:
        raise RegistryError(f"invalid Consul address {address!r}: {exc}") from None
    ssl_env = env.get("CONSUL_HTTP_SSL", "").lower()
    scheme = settings.scheme or (
        parsed.scheme if parsed.scheme in ("http", "https") else None
    ) or ("https" if ssl_env in ("1", "true") else "http")  # fmt: skip
    ca_cert = settings.ca_cert or env.get("CONSUL_CACERT")
    verify: bool | str
    if settings.verify is not None:
        verify = settings.verify
    elif env.get("CONSUL_HTTP_SSL_VERIFY", "").lower() in ("0", "false"):
        verify = False
    else:
        verify = True
    if verify and ca_cert:
        verify = str(ca_cert)
    client_cert = settings.client_cert or env.get("CONSUL_CLIENT_CERT")
    client_key = settings.client_key or env.get("CONSUL_CLIENT_KEY")
    cert: tuple[str, str] | str | None = None
    if client_cert and client_key:
        cert = (str(client_cert), str(client_key))
    elif client_cert:
        cert = str(client_cert)
    token = settings.token.get_secret_value() if settings.token else env.get("CONSUL_HTTP_TOKEN")
    if not token and env.get("CONSUL_HTTP_TOKEN_FILE"):
        token_file = Path(env["CONSUL_HTTP_TOKEN_FILE"])
        try:
            token = token_file.read_text(encoding="utf-8").strip()
        except OSError as exc:
            raise RegistryError(
                f"CONSUL_HTTP_TOKEN_FILE: cannot read {token_file}: {exc.strerror}"
            ) from None
    return ConsulConnection(
        host=parsed.hostname or "127.0.0.1",
        port=port or (443 if scheme == "https" else 8500),
        scheme=scheme,
        token=token or None,
        verify=verify,
        cert=cert,
    )
