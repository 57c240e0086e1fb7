"""The router's ``region:`` block: where a client is (:mod:`geo_router.region`)
and how far every region is from every other (:class:`servekit.rtt.RttTable`)."""

from __future__ import annotations

import ipaddress
from pathlib import Path

from pydantic import Field, field_validator

from servekit import rtt
from servekit.config import Section

__all__ = ["GeoIPSettings", "RegionSettings"]


class GeoIPSettings(Section):
    database: Path = Field(description="GeoLite2/GeoIP2 City .mmdb file.")
    regions: dict[str, str] = Field(
        default_factory=dict,
        description="'CC-SUBDIVISION' or 'CC' (ISO codes) to region, most specific wins.",
    )


class RegionSettings(Section):
    default: str = "local"
    trusted_header: str = Field("X-Client-Region", description="Set by the load balancer.")
    trusted_proxies: list[str] = Field(
        default_factory=list, description="CIDRs whose region header and X-Forwarded-For count."
    )
    cidrs: dict[str, str] = Field(default_factory=dict, description="Client CIDR to region.")
    geoip: GeoIPSettings | None = None
    # The RTT table's fields under the router's own names (servekit.rtt.RttTable).
    rtt_ms: dict[str, dict[str, float]] = Field(
        default_factory=dict, description="RTT between regions; symmetric if one side is given."
    )
    same_region_rtt_ms: float = Field(rtt.SAME_REGION_MS, ge=0)
    unknown_rtt_ms: float = Field(rtt.DEFAULT_MS, ge=0)
    measured_rtt: bool = Field(
        False,
        description="Price users in the default region (the router's own) with the RTT the "
        "router measures to each instance on its /load polls (the minimum of the last 10) "
        "instead of the table, once one was measured; users elsewhere keep the table.",
    )

    def rtt_table(self) -> rtt.RttTable:
        return rtt.RttTable(
            rtt_ms=self.rtt_ms,
            same_region_ms=self.same_region_rtt_ms,
            default_ms=self.unknown_rtt_ms,
        )

    @field_validator("trusted_proxies")
    @classmethod
    def _proxies(cls, value: list[str]) -> list[str]:
        for cidr in value:
            ipaddress.ip_network(cidr, strict=False)
        return value

    @field_validator("cidrs")
    @classmethod
    def _cidrs(cls, value: dict[str, str]) -> dict[str, str]:
        for cidr in value:
            ipaddress.ip_network(cidr, strict=False)
        return value
