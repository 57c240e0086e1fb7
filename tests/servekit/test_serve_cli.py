"""The one ``serve`` command: flags generated from each service's settings blocks."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from central.cli import SERVICE as CENTRAL
from edge_agent.cli import SERVICE as EDGE
from geo_router.cli import SERVICE as ROUTER
from geo_router.settings import RouterSettings
from servekit.config import load_settings
from servekit.serve_cli import Service, add_serve_command, restart_only_changes, serve_overrides


def _parse(service: Service[object], argv: list[str]) -> argparse.Namespace:  # type: ignore[type-var]
    parser = argparse.ArgumentParser()
    add_serve_command(parser.add_subparsers(dest="command"), service)
    return parser.parse_args(["serve", *argv])


def test_every_service_gets_the_server_flags() -> None:
    for service in (ROUTER, EDGE, CENTRAL):
        args = _parse(service, ["--config", "x.yaml", "--host", "0.0.0.0", "--port", "9"])
        assert serve_overrides(args) == {
            **{k: None for k in serve_overrides(args) if k not in ("server.host", "server.port")},
            "server.host": "0.0.0.0",
            "server.port": 9,
        }
        assert args.config == Path("x.yaml")


def test_instance_flags_come_from_the_instance_block() -> None:
    args = _parse(EDGE, ["--config", "e.yaml", "--region", "west", "--id", "edge-w"])
    given = {k: v for k, v in serve_overrides(args).items() if v is not None}
    assert given == {"instance.region": "west", "instance.id": "edge-w"}
    # The router has no instance block, so no --region.
    with pytest.raises(SystemExit):
        _parse(ROUTER, ["--region", "west"])


def test_flags_are_typed_and_choices_checked() -> None:
    args = _parse(ROUTER, ["--graceful-shutdown-s", "2.5", "--log-level", "debug"])
    given = {k: v for k, v in serve_overrides(args).items() if v is not None}
    assert given == {"server.graceful_shutdown_s": 2.5, "server.log_level": "debug"}
    with pytest.raises(SystemExit):
        _parse(ROUTER, ["--log-level", "loud"])
    with pytest.raises(SystemExit):
        _parse(EDGE, [])  # the edge agent needs --config


def test_router_listening_keys_at_the_top_level_still_load(tmp_path: Path) -> None:
    old = tmp_path / "old.yaml"
    old.write_text("host: 0.0.0.0\nport: 8123\nmax_body_bytes: 4096\ngraceful_shutdown_s: 3\n")
    settings = load_settings(RouterSettings, old, **{"server.port": 9000})
    assert (settings.server.host, settings.server.port) == ("0.0.0.0", 9000)
    assert (settings.server.max_body_bytes, settings.server.graceful_shutdown_s) == (4096, 3.0)
    new = tmp_path / "new.yaml"
    new.write_text(
        "server: {host: 0.0.0.0, port: 8123, max_body_bytes: 4096, graceful_shutdown_s: 3}\n"
    )
    assert load_settings(RouterSettings, new).server == load_settings(RouterSettings, old).server


def test_the_server_block_wins_over_a_top_level_key(tmp_path: Path) -> None:
    both = tmp_path / "both.yaml"
    both.write_text("port: 1\nhost: 0.0.0.0\nserver: {port: 2}\n")
    server = load_settings(RouterSettings, both).server
    assert (server.port, server.host) == (2, "0.0.0.0")


def test_router_defaults_are_kept() -> None:
    server = RouterSettings().server
    assert (server.port, server.max_body_bytes, server.log_level) == (8000, 1_000_000, "warning")


def test_a_reload_names_the_server_fields_it_cannot_change() -> None:
    running = RouterSettings()
    fresh = RouterSettings.model_validate(
        {"server": {"send_stall_s": 5, "max_connections": 10, "max_body_bytes": 4096}}
    )
    assert restart_only_changes(running, fresh) == ["send_stall_s", "max_connections"]
    assert restart_only_changes(running, RouterSettings()) == []
