"""SIGHUP makes a running router accept the API keys its settings file lists now.

A real ``geo-router serve`` process: the new key is refused before the
reload and accepted after it, the removed one the other way round, and a
file that no longer loads changes nothing.
"""

from __future__ import annotations

import signal
import subprocess
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import yaml

from geo_router.auth_settings import hash_key
from hybrid_llm.local.servers import free_port, service_process
from tests.geo_router.conftest import serve_fake, upstream
from tests.geo_router.fake_upstream import Behavior

OLD, NEW = "sk-reload-old", "sk-reload-new"


def _config(path: Path, up: str, keys: list[str], port: int) -> None:
    data: dict[str, Any] = {
        # The listening block the old way (top level) and a flag on top (--log-level).
        "host": "127.0.0.1",
        "port": port,
        "auth": {"keys": [{"sha256": hash_key(k), "tenant": k} for k in keys]},
        "upstreams": [upstream(up)],
        "poll_interval_s": 0.2,
    }
    path.write_text(yaml.safe_dump(data))


def _status(url: str, key: str) -> int:
    headers = {"Authorization": f"Bearer {key}"}
    return httpx.get(url + "/v1/models", headers=headers, timeout=5).status_code


def _until(url: str, key: str, status: int) -> int:
    deadline = time.monotonic() + 10
    got = _status(url, key)
    while got != status and time.monotonic() < deadline:
        time.sleep(0.1)
        got = _status(url, key)
    return got


def test_sighup_reloads_the_api_keys(tmp_path: Path) -> None:
    cfg = tmp_path / "router.yaml"
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    with serve_fake(Behavior()) as up:
        _config(cfg, up, [OLD], port)
        args = ["geo_router", "serve", "--config", str(cfg), "--log-level", "info"]
        with service_process(args, url) as proc:
            assert (_status(url, OLD), _status(url, NEW)) == (200, 401)

            _config(cfg, up, [NEW], port)
            proc.send_signal(signal.SIGHUP)
            assert _until(url, NEW, 200) == 200
            assert _status(url, OLD) == 401

            cfg.write_text("auth: {keys: [{sha256: not-hex, tenant: x}]}\n")
            proc.send_signal(signal.SIGHUP)
            time.sleep(0.5)
            assert (_status(url, NEW), _status(url, OLD)) == (200, 401)
            assert proc.poll() is None


@contextmanager
def _logged_router(tmp_path: Path) -> Iterator[tuple[str, Path, Path, subprocess.Popen[bytes]]]:
    """A router serving ``OLD`` from a config file, its log at info: (url, config,
    log, process)."""
    cfg = tmp_path / "router.yaml"
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    log = tmp_path / "router.log"
    with serve_fake(Behavior()) as up:
        _config(cfg, up, [OLD], port)
        args = ["geo_router", "serve", "--config", str(cfg), "--log-level", "info"]
        with log.open("wb") as out, service_process(args, url, stderr=out) as proc:
            yield url, cfg, log, proc


def _reload(proc: subprocess.Popen[bytes], cfg: Path, change: Callable[[Any], None]) -> None:
    """Edit the config file with ``change`` and send SIGHUP."""
    data = yaml.safe_load(cfg.read_text())
    change(data)
    cfg.write_text(yaml.safe_dump(data))
    proc.send_signal(signal.SIGHUP)


def test_a_reload_that_would_admit_anonymous_callers_is_refused(tmp_path: Path) -> None:
    with _logged_router(tmp_path) as (url, cfg, log, proc):
        _reload(proc, cfg, lambda data: data["auth"].update(required=False))
        deadline = time.monotonic() + 10
        while "reload refused" not in log.read_text() and time.monotonic() < deadline:
            time.sleep(0.1)
        anonymous = httpx.get(url + "/v1/models", timeout=5).status_code
        assert anonymous == 401  # still closed
        assert _status(url, OLD) == 200
        assert proc.poll() is None
    assert "removes authentication (auth.required is false" in log.read_text()


def _stall_and_new_key(data: Any) -> None:
    data["server"] = {"send_stall_s": 5}
    data["auth"]["keys"] = [{"sha256": hash_key(NEW), "tenant": NEW}]


def test_a_reload_says_which_connection_limits_need_a_restart(tmp_path: Path) -> None:
    with _logged_router(tmp_path) as (url, cfg, log, proc):
        _reload(proc, cfg, _stall_and_new_key)
        assert _until(url, NEW, 200) == 200  # what can change still does
        assert proc.poll() is None
    assert "server.send_stall_s changed, which needs a restart" in log.read_text()
