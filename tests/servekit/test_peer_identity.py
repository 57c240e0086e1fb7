"""The certificate name a peer's role asks for, and a peer that cannot have one."""

from __future__ import annotations

import pytest

from servekit.peer_identity import IdentityUnusable, expected_name
from servekit.peers import IdentityRefused, PeerSettings, PlainTextRefused


def test_names_by_identity() -> None:
    assert expected_name("host", "hybrid-llm.internal", "edge", "edge-a") is None
    assert expected_name("tier", "hybrid-llm.internal", "center", "c1") == (
        "center.hybrid-llm.internal"
    )
    assert expected_name("instance", "Fleet.Example", "edge", "Edge-A-017") == (
        "edge-a-017.edge.fleet.example"
    )


@pytest.mark.parametrize("iid", ["http://10.0.0.7:8101", "edge_a", "a.b", "-edge", "x" * 64, ""])
def test_an_id_that_is_no_dns_label_has_no_name(iid: str) -> None:
    with pytest.raises(IdentityUnusable, match="not a DNS label"):
        expected_name("instance", "hybrid-llm.internal", "edge", iid)


def test_credentials_bound_to_a_peer_refuse_what_cannot_be_checked() -> None:
    creds = PeerSettings(identity="instance").credentials()
    good = creds.for_peer("edge", "edge-a")
    assert good.server_name == "edge-a.edge.hybrid-llm.internal"
    good.check_url("https://10.0.0.7:8101/v1/chat/completions")
    with pytest.raises(PlainTextRefused, match="only be checked over TLS"):
        good.check_url("http://10.0.0.7:8101/v1/chat/completions")
    with pytest.raises(IdentityRefused, match="not a DNS label"):
        creds.for_peer("edge", "edge_a").check_url("https://10.0.0.7:8101/load")
    host = PeerSettings().credentials()
    assert host.for_peer("edge", "edge_a") is host  # identity: host binds nothing


@pytest.mark.parametrize("domain", ["", "fleet..internal", ".internal", "bad domain"])
def test_a_domain_no_certificate_can_carry_fails_at_start(domain: str) -> None:
    with pytest.raises(ValueError, match="identity_domain"):
        PeerSettings(identity="tier", identity_domain=domain)
    assert PeerSettings(identity_domain="Fleet.Example").identity_domain == "fleet.example"
