"""RegistrySettings from YAML and open_registry picking the backend."""

from __future__ import annotations

import contextlib
from pathlib import Path

import pytest

from servekit.config import ConfigError, load_settings
from servekit.registry import RegistrySettings, open_registry
from servekit.registry.consul import ConsulRegistry
from servekit.registry.embedded import EmbeddedRegistry
from servekit.registry.static import StaticRegistry

pytestmark = pytest.mark.anyio


async def test_embedded_from_yaml_creates_its_directory(tmp_path: Path) -> None:
    db = tmp_path / "var" / "nested" / "registry.db"
    cfg = tmp_path / "svc.yaml"
    cfg.write_text(
        f"backend: embedded\nembedded: {{path: {db}}}\nttl_s: 4\nheartbeat_interval_s: 1\n"
    )
    settings = load_settings(RegistrySettings, cfg)
    async with contextlib.aclosing(await open_registry(settings)) as registry:
        assert isinstance(registry, EmbeddedRegistry)
        await registry.put("k", b"v")
    assert db.is_file()


async def test_consul_and_static_backends(tmp_path: Path) -> None:
    settings = RegistrySettings.model_validate(
        {"backend": "consul", "consul": {"service_name": "fleet"}}
    )
    registry = await open_registry(settings, environ={"CONSUL_HTTP_ADDR": "10.9.9.9:8500"})
    assert isinstance(registry, ConsulRegistry)
    assert (registry.connection.host, registry.settings.service_name) == ("10.9.9.9", "fleet")
    await registry.aclose()

    static = RegistrySettings.model_validate(
        {"backend": "static", "static": {"entries": [
            {"url": "http://127.0.0.1:9", "tier": "edge", "region": "eu", "model": "m"}]}}
    )  # fmt: skip
    registry = await open_registry(static)
    assert isinstance(registry, StaticRegistry)
    assert await registry.instances() == []  # probed at open: port 9 is closed
    assert len(await registry.instances(healthy_only=False)) == 1
    await registry.aclose()


def test_invalid_settings_name_the_field(tmp_path: Path) -> None:
    cfg = tmp_path / "bad.yaml"
    cfg.write_text("backend: zookeeper\n")
    with pytest.raises(ConfigError, match="backend"):
        load_settings(RegistrySettings, cfg)
    cfg.write_text("ttl_s: 2\nheartbeat_interval_s: 3\n")
    with pytest.raises(ConfigError, match="heartbeat_interval_s"):
        load_settings(RegistrySettings, cfg)
    cfg.write_text("consul: {adress: typo:8500}\n")
    with pytest.raises(ConfigError, match=r"consul\.adress"):
        load_settings(RegistrySettings, cfg)
