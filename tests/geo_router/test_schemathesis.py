"""schemathesis ``--checks all`` against the router's own OpenAPI document (bounded)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from geo_router.app import create_app
from hybrid_llm.local.servers import UvicornThread
from servekit.http_protocol import HeadWithBodyProtocol
from tests.geo_router.conftest import KEY, router_settings, serve_fake, upstream
from tests.geo_router.fake_upstream import Behavior


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_schemathesis_finds_nothing(tmp_path: Path) -> None:
    with (
        serve_fake(Behavior(words=3)) as up,
        UvicornThread(
            create_app(router_settings([upstream(up)])), http=HeadWithBodyProtocol
        ) as router,
    ):
        cmd = [
            str(Path(sys.executable).parent / "schemathesis"),
            "run",
            router.url + "/openapi.json",
            "--checks",
            "all",
            "--max-examples",
            "40",
            "--seed",
            "1",
            "-H",
            f"Authorization: Bearer {KEY}",
            "--no-color",
        ]
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=600, cwd=tmp_path)
    assert done.returncode == 0, done.stdout[-4000:]
