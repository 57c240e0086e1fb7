"""Registry: discovery of serving instances and shared desired state.

Open one with :func:`open_registry` from :class:`RegistrySettings`; keep an
instance registered with :class:`Heartbeater`; read the catalog without
waiting on the registry through :class:`CatalogView`.
"""

from servekit.registry.factory import open_registry
from servekit.registry.heartbeat import Heartbeater
from servekit.registry.protocol import (
    AccessFiltered,
    Catalog,
    InstanceInfo,
    InstanceState,
    KVEntry,
    KVStore,
    LockHandle,
    NotRegistered,
    Registry,
    RegistryError,
    RegistryRejected,
    RegistryUnavailable,
    Tier,
    WrongAgent,
)
from servekit.registry.settings import (
    ConsulSettings,
    EmbeddedSettings,
    RegistrySettings,
    StaticEntry,
    StaticSettings,
)
from servekit.registry.view import CatalogView

__all__ = [
    "AccessFiltered",
    "Catalog",
    "CatalogView",
    "ConsulSettings",
    "EmbeddedSettings",
    "Heartbeater",
    "InstanceInfo",
    "InstanceState",
    "KVEntry",
    "KVStore",
    "LockHandle",
    "NotRegistered",
    "Registry",
    "RegistryError",
    "RegistryRejected",
    "RegistrySettings",
    "RegistryUnavailable",
    "StaticEntry",
    "StaticSettings",
    "Tier",
    "WrongAgent",
    "open_registry",
]
