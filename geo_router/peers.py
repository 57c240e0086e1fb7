"""Which token and TLS trust the router uses for an upstream instance.

A static upstream's own ``client:`` block wins, then its tier's
(``peers.edge`` / ``peers.center``), then ``peers.default``. Each distinct
block is built once (:meth:`servekit.peers.PeerSettings.credentials`) and
shared by the data path (``UpstreamPool``) and the ``/ready`` + ``/load``
probes (one ``httpx.AsyncClient`` per block), so a probe and a request to the
same instance always carry the same credentials.

With ``identity: tier`` or ``instance`` in a block, each instance gets the
block bound to the certificate name its tier (and id) must carry
(:meth:`~servekit.peers.PeerCredentials.for_peer`), made once per instance:
a registration claiming ``tier: center`` is reached only if its certificate
names the center.
"""

from __future__ import annotations

from collections.abc import Sequence

import httpx

from geo_router.settings import PeersSettings, UpstreamSettings
from servekit.peers import PeerCredentials, PeerSettings, async_client
from servekit.registry.protocol import InstanceInfo, Tier

__all__ = ["PeerBook"]

_MAX_BOUND = 8192  # instances with their certificate name bound in, kept


class PeerBook:
    """Credentials per instance; owns the probe clients it hands out (close with :meth:`aclose`)."""

    def __init__(
        self,
        peers: PeersSettings,
        upstreams: Sequence[UpstreamSettings] = (),
        *,
        probe_timeout_s: float = 1.0,
    ) -> None:
        self._probe_timeout_s = probe_timeout_s
        built: dict[int, PeerCredentials] = {}

        def build(settings: PeerSettings) -> PeerCredentials:
            if id(settings) not in built:
                built[id(settings)] = settings.credentials()
            return built[id(settings)]

        self._tiers: dict[Tier, PeerCredentials] = {
            "edge": build(peers.for_tier("edge")),
            "center": build(peers.for_tier("center")),
        }
        self._by_id = {
            (u.id or u.url.rstrip("/")): build(u.client) for u in upstreams if u.client is not None
        }
        self._clients: dict[PeerCredentials, httpx.AsyncClient] = {}
        self._bound: dict[tuple[PeerCredentials, Tier, str], PeerCredentials] = {}

    def for_instance(self, info: InstanceInfo) -> PeerCredentials:
        creds = self._by_id.get(info.id) or self._tiers[info.tier]
        if creds.identity == "host":
            return creds
        key = (creds, info.tier, info.id)
        bound = self._bound.get(key)
        if bound is None:
            if len(self._bound) >= _MAX_BOUND:  # ids that came and went
                self._bound.clear()
            bound = self._bound[key] = creds.for_peer(info.tier, info.id)
        return bound

    def probe_client(self, info: InstanceInfo) -> httpx.AsyncClient:
        """An HTTP client with this instance's credentials (shared per credentials)."""
        creds = self.for_instance(info)
        client = self._clients.get(creds)
        if client is None:
            client = self._clients[creds] = async_client(creds, timeout=self._probe_timeout_s)
        return client

    async def aclose(self) -> None:
        clients, self._clients = list(self._clients.values()), {}
        for client in clients:
            await client.aclose()
