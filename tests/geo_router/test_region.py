from __future__ import annotations

from geo_router.region import RegionResolver
from geo_router.region_settings import RegionSettings

SETTINGS = RegionSettings(
    default="center",
    trusted_header="X-Client-Region",
    trusted_proxies=["10.0.0.0/8"],
    cidrs={"192.168.0.0/16": "east", "192.168.7.0/24": "west", "2001:db8::/32": "west"},
    rtt_ms={"east": {"west": 70.0}},
)


def test_trusted_proxy_header_wins() -> None:
    r = RegionResolver(SETTINGS).resolve("10.1.2.3", {"x-client-region": "north"})
    assert (r.region, r.source) == ("north", "header")


def test_header_from_an_untrusted_peer_is_ignored() -> None:
    r = RegionResolver(SETTINGS).resolve("192.168.1.1", {"x-client-region": "north"})
    assert (r.region, r.source) == ("east", "cidr")


def test_forwarded_for_is_read_behind_a_trusted_proxy_only() -> None:
    resolver = RegionResolver(SETTINGS)
    behind = resolver.resolve("10.0.0.9", {"x-forwarded-for": "192.168.7.5, 10.0.0.2"})
    assert (behind.region, behind.client_ip) == ("west", "192.168.7.5")
    spoofed = resolver.resolve("8.8.8.8", {"x-forwarded-for": "192.168.7.5"})
    assert (spoofed.region, spoofed.source) == ("center", "default")


def test_longest_prefix_and_ipv6() -> None:
    resolver = RegionResolver(SETTINGS)
    assert resolver.resolve("192.168.7.9", {}).region == "west"
    assert resolver.resolve("192.168.8.9", {}).region == "east"
    assert resolver.resolve("2001:db8::1", {}).region == "west"
    assert resolver.resolve("not-an-ip", {}).source == "default"
    assert resolver.resolve(None, {}).region == "center"


def test_rtt_table_is_symmetric_with_defaults() -> None:
    rtt = SETTINGS.rtt_table()
    assert rtt.rtt("east", "west") == rtt.rtt("west", "east") == 70.0
    assert rtt.rtt("east", "east") == SETTINGS.same_region_rtt_ms
    assert rtt.rtt("east", "mars") == SETTINGS.unknown_rtt_ms


def test_repeated_peers_answer_alike_and_proxies_follow_their_headers() -> None:
    resolver = RegionResolver(SETTINGS)
    for _ in range(2):  # the second answer comes from the per-peer memory
        assert resolver.resolve("192.168.7.9", {"x-client-region": "north"}).region == "west"
        assert resolver.resolve("not-an-ip", {}).source == "default"
    # A trusted proxy's answer depends on its headers, every time.
    assert resolver.resolve("10.0.0.9", {"x-client-region": "north"}).region == "north"
    assert resolver.resolve("10.0.0.9", {"x-client-region": "south"}).region == "south"
    assert resolver.resolve("10.0.0.9", {"x-forwarded-for": "192.168.7.5"}).region == "west"
    assert resolver.resolve("10.0.0.9", {}).region == "center"
