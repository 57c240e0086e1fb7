"""The registry KV layout model_sync owns, and the names allowed in it.

Every key is built here; nothing else formats a key by hand. Model names,
versions and artifact file names also become directory and file names on
edge nodes, so they are checked against one strict pattern: no separators,
no leading dot, no ``..`` - a name can never escape the model directory.

Layout::

    models/<name>/versions/<version>   artifact record (JSON)
    models/<name>/aliases/<alias>      {"version": ...} (stable, canary)
    models/<name>/traffic              {"shares": {"<version>": fraction}} (read by the router)
    models/<name>/feedback/<version>/<router>  {"rated", "accepted"} (written by each router)
    nodes/<node_id>/desired            {"model", "version"}
    nodes/<node_id>/actual             what the node serves and is doing
    rollouts/<name>/plan               the rollout plan
    rollouts/<name>/state              the controller's persisted progress
    history/<time_ns>-<uuid>           one operator or controller action
    locks/rollout                      the controller's single-holder lock
    locks/rollout-active               names the one rollout in progress (CAS-created)
"""

from __future__ import annotations

import re
import time
import uuid

__all__ = [
    "ACTIVE_ROLLOUT",
    "HISTORY_PREFIX",
    "MODELS_PREFIX",
    "NODES_PREFIX",
    "ROLLOUTS_PREFIX",
    "ROLLOUT_LOCK",
    "InvalidName",
    "actual_key",
    "alias_key",
    "aliases_prefix",
    "check_name",
    "check_node_id",
    "desired_key",
    "feedback_key",
    "feedback_prefix",
    "history_key",
    "plan_key",
    "rollout_state_key",
    "traffic_key",
    "version_key",
    "versions_prefix",
]

MODELS_PREFIX = "models/"
NODES_PREFIX = "nodes/"
ROLLOUTS_PREFIX = "rollouts/"
HISTORY_PREFIX = "history/"
ROLLOUT_LOCK = "locks/rollout"
ACTIVE_ROLLOUT = "locks/rollout-active"

# Names that end up as path segments on disk: letters, digits, ``._-``,
# starting with a letter or digit (so never ``.`` / ``..`` / a hidden file).
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")
# Node ids only ever appear in keys; instance ids may carry ``:`` or ``@``.
_NODE_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:@-]{0,127}")


class InvalidName(ValueError):
    """A model name, version, alias, file name or node id that is not allowed."""


def check_name(kind: str, value: str) -> str:
    """Return ``value`` if it is a safe single path segment, else raise :class:`InvalidName`."""
    if not isinstance(value, str) or not _NAME.fullmatch(value) or ".." in value:
        raise InvalidName(
            f"invalid {kind} {value!r}: use letters, digits and ._- (no '/', no '..', "
            "no leading dot, at most 128 characters)"
        )
    return value


def check_node_id(value: str) -> str:
    if not isinstance(value, str) or not _NODE_ID.fullmatch(value) or ".." in value:
        raise InvalidName(f"invalid node id {value!r}")
    return value


def versions_prefix(name: str) -> str:
    return f"{MODELS_PREFIX}{check_name('model name', name)}/versions/"


def version_key(name: str, version: str) -> str:
    return versions_prefix(name) + check_name("version", version)


def aliases_prefix(name: str) -> str:
    return f"{MODELS_PREFIX}{check_name('model name', name)}/aliases/"


def alias_key(name: str, alias: str) -> str:
    return aliases_prefix(name) + check_name("alias", alias)


def traffic_key(name: str) -> str:
    return f"{MODELS_PREFIX}{check_name('model name', name)}/traffic"


def feedback_prefix(name: str, version: str) -> str:
    model, ver = check_name("model name", name), check_name("version", version)
    return f"{MODELS_PREFIX}{model}/feedback/{ver}/"


def feedback_key(name: str, version: str, source: str) -> str:
    return feedback_prefix(name, version) + check_name("feedback source", source)


def desired_key(node_id: str) -> str:
    return f"{NODES_PREFIX}{check_node_id(node_id)}/desired"


def actual_key(node_id: str) -> str:
    return f"{NODES_PREFIX}{check_node_id(node_id)}/actual"


def plan_key(name: str) -> str:
    return f"{ROLLOUTS_PREFIX}{check_name('model name', name)}/plan"


def rollout_state_key(name: str) -> str:
    return f"{ROLLOUTS_PREFIX}{check_name('model name', name)}/state"


def history_key(at: float | None = None, entry_id: str | None = None) -> str:
    """A history key that sorts by time; ``entry_id`` makes a retried write idempotent."""
    ns = int((time.time() if at is None else at) * 1e9)
    return f"{HISTORY_PREFIX}{ns:020d}-{entry_id or uuid.uuid4().hex}"
