"""Which name a peer's certificate must carry: its role, not just its address.

A fleet CA signs every edge's and every center's certificate. Checked only
against the address it is reached at (``identity: host``, the web's rule), a
certificate proves nothing about the *role*: a router that found an instance
in the registry (which any node can write) would accept a stolen edge's
certificate for a registration claiming ``tier: center``. So a client can ask
for a name that encodes the role instead, checked by the TLS library's own
hostname verification (the name is sent as SNI and matched against the
certificate's subject alternative names):

``tier``      ``<tier>.<domain>``, e.g. ``center.hybrid-llm.internal``
``instance``  ``<instance id>.<tier>.<domain>``, e.g. ``edge-a-017.edge.hybrid-llm.internal``

The CA issues each node a certificate naming its role (and its address, for
clients that still check that); see ``docs/security.md``, "A compromised node".
"""

from __future__ import annotations

import re
from typing import Literal

__all__ = ["DEFAULT_DOMAIN", "Identity", "IdentityUnusable", "check_domain", "expected_name"]

Identity = Literal["host", "tier", "instance"]
DEFAULT_DOMAIN = "hybrid-llm.internal"

_LABEL = re.compile(r"[a-z0-9](?:[a-z0-9-]{0,61}[a-z0-9])?")


class IdentityUnusable(ValueError):
    """The peer's id or tier cannot be part of a DNS name, so no certificate can match."""


def _label(value: str, what: str) -> str:
    low = value.lower()
    if not _LABEL.fullmatch(low):
        raise IdentityUnusable(
            f"{what} {value!r} is not a DNS label (letters, digits, '-'; at most 63), "
            "so no certificate can name it"
        )
    return low


def check_domain(domain: str) -> str:
    """``domain`` lower-cased; :class:`IdentityUnusable` unless it is dot-separated labels."""
    return ".".join(_label(part, "domain label") for part in domain.split("."))


def expected_name(identity: Identity, domain: str, tier: str, instance_id: str) -> str | None:
    """The name the peer's certificate must carry (None: the URL's host, ``identity: host``).

    Raises :class:`IdentityUnusable` for an id or tier that cannot be a DNS label.
    """
    if identity == "host":
        return None
    name = f"{_label(tier, 'tier')}.{domain.lower()}"
    if identity == "instance":
        name = f"{_label(instance_id, 'instance id')}.{name}"
    return name
