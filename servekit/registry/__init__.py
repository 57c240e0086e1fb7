"""Registry: discovery of serving instances and shared desired state."""

from servekit.registry.protocol import (
    Catalog,
    InstanceInfo,
    InstanceState,
    KVEntry,
    KVStore,
    LockHandle,
    NotRegistered,
    Registry,
    RegistryError,
    RegistryUnavailable,
    Tier,
)

__all__ = [
    "Catalog",
    "InstanceInfo",
    "InstanceState",
    "KVEntry",
    "KVStore",
    "LockHandle",
    "NotRegistered",
    "Registry",
    "RegistryError",
    "RegistryUnavailable",
    "Tier",
]
