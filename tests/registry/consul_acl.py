"""The Consul double's ACLs: tokens with rights, filtering with Consul's header.

A token's rights are ``"<resource>:<read|write>"`` strings over every name
(``write`` implies ``read``), e.g. ``{"service:write", "node:read"}``;
resources are ``service``, ``node``, ``key``, ``session`` and ``agent``.
Consul's own rules are prefix-scoped; one scope is enough to reproduce what a
client sees:

* an unknown token: ``403 ACL not found``;
* a write without the right: ``403 Permission denied: ...``; so is a single
  KV key read (``KVS.Get`` denies, ``agent/consul/kvs_endpoint.go``) and
  ``/v1/agent/self`` without ``agent:read``;
* a listing without the right (health, KV ``recurse``) is *filtered*: the
  hidden entries are left out and ``X-Consul-Results-Filtered-By-ACLs: true``
  is set, but only when a token was presented
  (``maskResultsFilteredByACLs`` blanks it for the anonymous token).
"""

from __future__ import annotations

from dataclasses import dataclass, field

__all__ = ["ALL_RIGHTS", "FILTERED_HEADER", "Acl", "Rights"]

FILTERED_HEADER = "X-Consul-Results-Filtered-By-ACLs"
ALL_RIGHTS = frozenset(f"{r}:write" for r in ("service", "node", "key", "session", "agent"))


class AclDenied(Exception):
    def __init__(self, text: str) -> None:
        super().__init__(text)
        self.text = text


@dataclass(frozen=True)
class Rights:
    token: str
    rules: frozenset[str]

    def allows(self, resource: str, access: str = "read") -> bool:
        return f"{resource}:write" in self.rules or (
            access == "read" and f"{resource}:read" in self.rules
        )

    def require(self, resource: str, access: str, name: str = "") -> None:
        if not self.allows(resource, access):
            raise AclDenied(
                f"Permission denied: token lacks permission '{resource}:{access}' on {name!r}"
            )

    @property
    def anonymous(self) -> bool:
        return not self.token


@dataclass
class Acl:
    """``tokens`` maps a secret to its rights; the anonymous token (no token
    sent) has ``anonymous`` rights (none: ``default_policy = "deny"``)."""

    tokens: dict[str, frozenset[str]] = field(default_factory=dict)
    anonymous: frozenset[str] = frozenset()

    def resolve(self, token: str) -> Rights:
        if not token:
            return Rights("", self.anonymous)
        if token not in self.tokens:
            raise AclDenied("ACL not found")
        return Rights(token, self.tokens[token])
