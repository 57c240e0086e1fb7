"""Ask an instance for its own load report: ``GET <base>/load`` -> :class:`LoadReport`.

Every service serves ``/load`` (the JSON its heartbeats carry). Readers that
need live figures ask it directly: the static registry for its entries, the
router for every instance the catalog lists (a Consul agent forwards
figures-only heartbeats to the catalog minutes late). The caller owns the
HTTP client, so credentials the instances require are set in one place.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import httpx

from servekit.engine.protocol import LoadReport
from servekit.registry.protocol import InstanceInfo

__all__ = ["LoadProbe"]


class LoadProbe:
    """``client_for`` picks the client for an instance (its tier's token and CA)."""

    def __init__(
        self,
        client: httpx.AsyncClient,
        path: str = "/load",
        *,
        client_for: Callable[[InstanceInfo], httpx.AsyncClient] | None = None,
    ) -> None:
        self.client = client
        self.path = path
        self.client_for = client_for

    async def fetch(
        self, base_url: str, info: InstanceInfo | None = None
    ) -> tuple[LoadReport | None, int]:
        """The instance's report (``None`` when it answered without one: not
        200, or not a JSON object) and the HTTP status. Transport failures
        (refused, timed out, reset) raise :class:`httpx.HTTPError`."""
        client = self.client
        if self.client_for is not None and info is not None:
            client = self.client_for(info)
        resp = await client.get(base_url.rstrip("/") + self.path)
        if resp.status_code != 200:
            return None, resp.status_code
        try:
            data: Any = resp.json()
            report = LoadReport.from_dict(data) if isinstance(data, dict) else None
        except (ValueError, TypeError):
            report = None
        return report, resp.status_code
