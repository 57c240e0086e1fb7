"""Where a user is (how far every region is from every other is
:class:`servekit.rtt.RttTable`, built by ``RegionSettings.rtt_table``).

Resolution order: the load balancer's region header (only when the peer is a
configured trusted proxy), the client IP through the CIDR table (longest
prefix wins), a GeoLite2 City lookup when configured, the default region.
Behind a trusted proxy the client IP is the last ``X-Forwarded-For`` hop that
is not itself a trusted proxy.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal, Protocol

from geo_router.region_settings import RegionSettings

__all__ = ["GeoLookup", "RegionResolver", "ResolvedRegion", "open_geoip"]

IPNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network
IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address
Source = Literal["header", "cidr", "geoip", "default"]


@dataclass(frozen=True, slots=True)
class ResolvedRegion:
    region: str
    source: Source
    client_ip: str | None


class GeoLookup(Protocol):
    def region_of(self, ip: str) -> str | None: ...

    def close(self) -> None: ...


_PEERS_MAX = 65536  # peer addresses whose region is remembered


class RegionResolver:
    def __init__(self, settings: RegionSettings, geo: GeoLookup | None = None) -> None:
        self._default = settings.default
        self._header = settings.trusted_header.lower()
        self._proxies = [ipaddress.ip_network(c, strict=False) for c in settings.trusted_proxies]
        table = [(ipaddress.ip_network(c, strict=False), r) for c, r in settings.cidrs.items()]
        # Longest prefix first, so the first match is the most specific one.
        self._cidrs: list[tuple[IPNetwork, str]] = sorted(
            table, key=lambda item: item[0].prefixlen, reverse=True
        )
        self._geo = geo
        # Peers that are not trusted proxies: their region depends on the
        # address alone (CIDR table, GeoIP, default), so it is worked out once
        # per address; parsing and matching addresses is the slow part.
        self._by_peer: dict[str, ResolvedRegion] = {}

    def resolve(self, peer: str | None, headers: Mapping[str, str]) -> ResolvedRegion:
        if peer is not None:
            known = self._by_peer.get(peer)
            if known is not None:
                return known
        peer_ip = _parse_ip(peer)
        if peer_ip is not None and self._trusted(peer_ip):
            region = headers.get(self._header, "").strip()
            if region:
                return ResolvedRegion(region, "header", str(peer_ip))
            forwarded = self._forwarded_client(headers.get("x-forwarded-for", ""), peer_ip)
            return self._of_address(forwarded)
        resolved = self._of_address(peer_ip)
        if peer is not None:
            if len(self._by_peer) >= _PEERS_MAX:
                self._by_peer.clear()
            self._by_peer[peer] = resolved
        return resolved

    def _of_address(self, client_ip: IPAddress | None) -> ResolvedRegion:
        if client_ip is None:
            return ResolvedRegion(self._default, "default", None)
        for net, region in self._cidrs:
            if client_ip.version == net.version and client_ip in net:
                return ResolvedRegion(region, "cidr", str(client_ip))
        if self._geo is not None:
            found = self._geo.region_of(str(client_ip))
            if found:
                return ResolvedRegion(found, "geoip", str(client_ip))
        return ResolvedRegion(self._default, "default", str(client_ip))

    def _trusted(self, ip: IPAddress) -> bool:
        return any(ip.version == n.version and ip in n for n in self._proxies)

    def _forwarded_client(self, header: str, peer: IPAddress) -> IPAddress:
        for hop in reversed([h.strip() for h in header.split(",") if h.strip()]):
            ip = _parse_ip(hop)
            if ip is None:
                break
            if not self._trusted(ip):
                return ip
        return peer


def _parse_ip(text: str | None) -> IPAddress | None:
    if not text:
        return None
    try:
        return ipaddress.ip_address(text)
    except ValueError:
        return None


class _GeoIP2:
    """GeoLite2 City through ``geoip2`` (memory-mapped; a lookup takes microseconds)."""

    def __init__(self, reader: Any, regions: Mapping[str, str]) -> None:
        self._reader = reader
        self._regions = dict(regions)

    def region_of(self, ip: str) -> str | None:
        import geoip2.errors

        try:
            city = self._reader.city(ip)
        except (geoip2.errors.AddressNotFoundError, ValueError):
            return None
        country = city.country.iso_code or ""
        sub = city.subdivisions.most_specific.iso_code or ""
        for key in (f"{country}-{sub}", country):
            if key in self._regions:
                return self._regions[key]
        return None

    def close(self) -> None:
        self._reader.close()


def open_geoip(settings: RegionSettings) -> GeoLookup | None:
    if settings.geoip is None:
        return None
    import geoip2.database
    import maxminddb

    reader = geoip2.database.Reader(str(settings.geoip.database), mode=maxminddb.MODE_MMAP)
    return _GeoIP2(reader, settings.geoip.regions)
