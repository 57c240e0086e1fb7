"""The gateway's catalog entry: tier ``center``, its public model, its replicas' capacity.

:class:`servekit.registration.Registration` registers it and beats the
aggregate load report (what ``/load`` shows), so the geo router sees the
center's queue like any edge's.
"""

from __future__ import annotations

from central.settings import CentralSettings
from servekit.registration import instance_entry
from servekit.registry import InstanceInfo

__all__ = ["center_instance"]


def center_instance(settings: CentralSettings, capacity: int) -> InstanceInfo:
    """The catalog entry for this gateway."""
    return instance_entry(
        settings.instance,
        settings.server,
        tier="center",
        model=settings.model,
        version=settings.version,
        capacity=capacity,
        tags=tuple(sorted({r.kind for r in settings.replicas})),
    )
