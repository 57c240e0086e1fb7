"""Per-node Consul ACL policies, rendered from ``deploy/consul/policy-node.hcl.tmpl``.

A node's token may write only ``nodes/<its id>/actual`` and read its own
desired version and the model records; the template says what Consul's ACL
model still cannot narrow (service writes go by service name).
:func:`render_node_policy` substitutes only checked names (a node id cannot
close a quote and add a rule), and :func:`rules` / :func:`allowed` read a
rendered policy back with Consul's matching (an exact rule beats a prefix
rule, the longest prefix wins, ``write`` implies ``read``) so a test, or an
operator, can ask what a token of it may do.
"""

from __future__ import annotations

import re
import string
from dataclasses import dataclass
from pathlib import Path

from model_sync.keys import InvalidName, check_node_id

__all__ = ["TEMPLATE", "Rule", "allowed", "render_node_policy", "rules"]

TEMPLATE = Path(__file__).resolve().parent.parent / "deploy" / "consul" / "policy-node.hcl.tmpl"
_CONSUL_NODE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,62}")
_RULE = re.compile(r'^(\w+)\s+"([^"]*)"\s*\{\s*policy\s*=\s*"(read|write|deny)"\s*\}\s*$')


@dataclass(frozen=True, slots=True)
class Rule:
    kind: str  # "key", "key_prefix", "service", "node_prefix", ...
    name: str
    policy: str


def render_node_policy(node_id: str, consul_node: str, template: str | None = None) -> str:
    """The policy text for one node; raises :class:`InvalidName` for unsafe names."""
    check_node_id(node_id)
    if not _CONSUL_NODE.fullmatch(consul_node):
        raise InvalidName(f"invalid Consul node name {consul_node!r}")
    text = TEMPLATE.read_text(encoding="utf-8") if template is None else template
    return string.Template(text).substitute(node_id=node_id, consul_node=consul_node)


def rules(policy: str) -> list[Rule]:
    """The rules of a rendered policy (one ``kind "name" { policy = "..." }`` a line)."""
    out: list[Rule] = []
    for line in policy.splitlines():
        line = line.split("#", 1)[0].strip()
        if not line:
            continue
        match = _RULE.match(line)
        if match is None:
            raise ValueError(f"not a one-line ACL rule: {line!r}")
        out.append(Rule(*match.groups()))
    return out


def allowed(policy: list[Rule], resource: str, name: str, access: str) -> bool:
    """Whether ``policy`` grants ``access`` (read or write) on ``resource`` ``name``."""
    exact = [r for r in policy if r.kind == resource and r.name == name]
    prefixes = [r for r in policy if r.kind == f"{resource}_prefix" and name.startswith(r.name)]
    if exact:
        rule = exact[-1]
    elif prefixes:
        rule = max(prefixes, key=lambda r: len(r.name))
    else:
        return False  # default_policy = "deny"
    return rule.policy == "write" or (rule.policy == "read" and access == "read")
