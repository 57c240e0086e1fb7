"""Request ids the router makes, and the client's own id kept apart from them.

A client's ``X-Request-Id`` is never the request's id: vLLM takes that header
as its internal request id, so a tenant that sent ``victim-123`` could collide
with another tenant's request. The router makes every id itself: a keyed
BLAKE2b of a per-process counter under a random per-process key, so ids are
unique, unpredictable and say nothing of how much traffic the router has seen
(a prefix and a visible counter did), without a system call per request
(``uuid4`` reads the OS entropy pool each time). The client's id, when it is a
plain token, rides along in ``X-Client-Request-Id`` for the client's own
correlation.
"""

from __future__ import annotations

import hashlib
import itertools
import re
import secrets
from collections.abc import Mapping

__all__ = ["CLIENT_ID_HEADER", "client_request_id", "new_request_id"]

CLIENT_ID_HEADER = "x-client-request-id"
_KEY = secrets.token_bytes(32)
_COUNTER = itertools.count(1)
# What a client's id may be: short printable tokens, nothing a header could break on.
_CLIENT_ID = re.compile(r"[A-Za-z0-9._:/+=@-]{1,128}")


def new_request_id() -> str:
    """A fresh id, ``req-`` and 24 hex digits."""
    n = next(_COUNTER).to_bytes(8, "little")
    return "req-" + hashlib.blake2b(n, key=_KEY, digest_size=12).hexdigest()


def client_request_id(headers: Mapping[str, str]) -> str | None:
    """The client's ``X-Request-Id`` if it is a plain token of at most 128 characters."""
    value = headers.get("x-request-id")
    if value is None or _CLIENT_ID.fullmatch(value) is None:
        return None
    return value
