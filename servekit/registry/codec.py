"""How instance identity and load reports travel as text, for every backend.

The embedded store keeps :class:`InstanceInfo` as a JSON column; Consul keeps
it as service fields plus string-only ``Meta``. Load reports are always the
JSON of :meth:`LoadReport.to_dict`. Decoding is lenient: a malformed load
report reads as the default (not ready) report rather than failing a whole
listing.

:func:`check_meta` holds every backend to Consul's rules for service meta
(``structs.ValidateServiceMetadata`` in Consul's ``agent/structs``): at most
64 pairs, keys of ``[A-Za-z0-9_-]`` up to 128 characters and not starting
with ``consul-`` (never ours: user keys travel as ``x-<key>``), values up
to 512 bytes. An instance whose identity would be
refused by a Consul agent is refused on the embedded store too, so a fleet
moved from one machine to Consul does not fail at its first registration.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from typing import Any

from servekit.engine.protocol import LoadReport
from servekit.registry.protocol import InstanceInfo, RegistryRejected, Tier

__all__ = [
    "check_meta",
    "info_from_json",
    "info_from_meta",
    "info_to_json",
    "info_to_meta",
    "load_from_json",
    "load_to_json",
    "sent_at_from_json",
]

# Meta keys written by us; user meta travels with this prefix so it can never
# collide with them (Consul reserves the ``consul-`` prefix for itself).
_USER_PREFIX = "x-"

# Consul's limits (agent/structs/structs.go: metaMaxKeyPairs, metaKeyMaxLength,
# metaValueMaxLength, MetaKeyReservedPrefix, metaKeyFormat).
_META_MAX_PAIRS = 64
_META_KEY_MAX = 128
_META_VALUE_MAX = 512  # bytes: Go's len() of the UTF-8 string
_META_KEY = re.compile(r"[A-Za-z0-9_-]+")
# (Consul also reserves keys starting "consul-"; ours never do: identity keys
# are fixed and user keys travel as "x-<key>".)


def info_to_json(info: InstanceInfo) -> str:
    return json.dumps(
        {
            "id": info.id,
            "tier": info.tier,
            "region": info.region,
            "address": info.address,
            "port": info.port,
            "model": info.model,
            "version": info.version,
            "capacity": info.capacity,
            "tags": list(info.tags),
            "meta": dict(info.meta),
        },
        separators=(",", ":"),
    )


def info_from_json(text: str) -> InstanceInfo:
    data: dict[str, Any] = json.loads(text)
    return InstanceInfo(
        id=str(data["id"]),
        tier=_tier(data.get("tier")),
        region=str(data.get("region", "")),
        address=str(data.get("address", "")),
        port=int(data.get("port", 0)),
        model=str(data.get("model", "")),
        version=str(data.get("version", "")),
        capacity=int(data.get("capacity", 1)),
        tags=tuple(str(t) for t in data.get("tags") or ()),
        meta={str(k): str(v) for k, v in (data.get("meta") or {}).items()},
    )


def info_to_meta(info: InstanceInfo) -> dict[str, str]:
    """The Consul service ``Meta`` for an instance (identity fields not in
    the service's own ID/Address/Port/Tags)."""
    meta = {
        "tier": info.tier,
        "region": info.region,
        "model": info.model,
        "version": info.version,
        "capacity": str(info.capacity),
    }
    for key, value in info.meta.items():
        meta[_USER_PREFIX + key] = value
    return meta


def check_meta(info: InstanceInfo) -> None:
    """Raise :class:`RegistryRejected` naming the first meta key (or value) a
    Consul agent would refuse; ``info.meta`` keys travel as ``x-<key>``."""
    meta = info_to_meta(info)
    if len(meta) > _META_MAX_PAIRS:
        raise RegistryRejected(
            f"instance {info.id!r} has {len(meta)} meta pairs ({len(info.meta)} of its own plus"
            f" {len(meta) - len(info.meta)} identity fields); Consul allows {_META_MAX_PAIRS}"
        )
    for key, value in meta.items():
        own = key[len(_USER_PREFIX) :] if key.startswith(_USER_PREFIX) else key
        where = f"instance {info.id!r} meta key {own!r}"
        if not _META_KEY.fullmatch(key):
            raise RegistryRejected(
                f"{where} is invalid: Consul allows only letters, digits, '_' and '-' in meta keys"
            )
        if len(key) > _META_KEY_MAX:
            raise RegistryRejected(
                f"{where} is too long: {len(key)} characters as {key!r} (it travels with the"
                f" {_USER_PREFIX!r} prefix); Consul allows {_META_KEY_MAX}"
            )
        size = len(value.encode())
        if size > _META_VALUE_MAX:
            raise RegistryRejected(
                f"{where} has a value of {size} bytes; Consul allows {_META_VALUE_MAX}"
            )


def info_from_meta(
    service_id: str,
    address: str,
    port: int,
    tags: list[str] | None,
    meta: Mapping[str, str] | None,
) -> InstanceInfo:
    """Rebuild an instance from Consul service fields; ``Meta`` may be ``null``."""
    meta = meta or {}
    try:
        capacity = int(meta.get("capacity", "1"))
    except ValueError:
        capacity = 1
    return InstanceInfo(
        id=service_id,
        tier=_tier(meta.get("tier")),
        region=meta.get("region", ""),
        address=address,
        port=port,
        model=meta.get("model", ""),
        version=meta.get("version", ""),
        capacity=capacity,
        tags=tuple(tags or ()),
        meta={k[len(_USER_PREFIX) :]: v for k, v in meta.items() if k.startswith(_USER_PREFIX)},
    )


def load_to_json(load: LoadReport, sent_at: float | None = None) -> str:
    """The report's JSON; ``sent_at`` (epoch seconds) rides along as an extra
    key where the backend keeps no heartbeat time of its own (Consul)."""
    data = load.to_dict()
    if sent_at is not None:
        data["sent_at"] = sent_at
    return json.dumps(data, separators=(",", ":"))


def sent_at_from_json(text: str | None) -> float:
    """The ``sent_at`` stamped by :func:`load_to_json`, or 0.0."""
    try:
        data = json.loads(text or "")
        return float(data["sent_at"]) if isinstance(data, dict) else 0.0
    except (ValueError, KeyError, TypeError):
        return 0.0


def load_from_json(text: str | None) -> LoadReport:
    if not text:
        return LoadReport()
    try:
        data = json.loads(text)
    except ValueError:
        return LoadReport()
    if not isinstance(data, dict):
        return LoadReport()
    try:
        return LoadReport.from_dict(data)
    except TypeError:
        return LoadReport()


def _tier(value: object) -> Tier:
    return "center" if value == "center" else "edge"
