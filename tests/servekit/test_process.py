"""Engine processes (shared by edge and center): logs, graceful stop, SIGKILL, backoff."""

from __future__ import annotations

import asyncio
import json
import os
import sys
import time
from pathlib import Path

import pytest

from servekit.engine.environ import engine_environ
from servekit.engine.process import (
    Backoff,
    EngineProcess,
    LaunchFailed,
    ProcessCommand,
    ProcessSettings,
    ProcessSupervisor,
)


def _plan(code: str, **env: str) -> ProcessCommand:
    return ProcessCommand((sys.executable, "-c", code), env)


def test_backoff_doubles_up_to_the_cap_and_resets_after_a_stable_run() -> None:
    b = Backoff(1.0, 8.0, stable_after_s=60.0)
    assert [b.delay(uptime_s=0.5) for _ in range(5)] == [1.0, 2.0, 4.0, 8.0, 8.0]
    assert b.delay(uptime_s=120.0) == 1.0
    assert b.delay(uptime_s=1.0) == 2.0


@pytest.mark.anyio
async def test_output_env_and_files_land_where_expected(tmp_path: Path) -> None:
    config = tmp_path / "run" / "r.yaml"
    code = (
        "import os, pathlib, sys; "
        "print('gpus', os.environ['CUDA_VISIBLE_DEVICES']); "
        f"print('config', pathlib.Path({str(config)!r}).read_text()); "
        "print('oops', file=sys.stderr)"
    )
    plan = ProcessCommand(
        (sys.executable, "-c", code), {"CUDA_VISIBLE_DEVICES": "2,3"}, {config: "k: v"}
    )
    proc = EngineProcess("r", plan, tmp_path / "logs" / "r.log")
    proc.start()
    await _wait_exit(proc)
    assert proc.returncode == 0
    log = (tmp_path / "logs" / "r.log").read_text()
    assert "starting r: CUDA_VISIBLE_DEVICES=2,3 " in log
    assert "gpus 2,3" in log
    assert "config k: v" in log
    assert "oops" in log
    # A second start appends to the same log.
    proc.start()
    await _wait_exit(proc)
    assert (tmp_path / "logs" / "r.log").read_text().count("--- ") == 2


@pytest.mark.anyio
async def test_the_engine_gets_an_allowlisted_environment_not_ours(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    ours = {
        "CONSUL_HTTP_TOKEN": "registry-secret",  # not on the list
        "CREDENTIALS_DIRECTORY": "/run/credentials/edge-agent.service",
        "AWS_SECRET_ACCESS_KEY": "cloud-secret",
        "HF_TOKEN": "hub-secret",  # an allowed prefix, but a secret's name
        "HF_HUB_OFFLINE": "1",
        "VLLM_LOGGING_LEVEL": "DEBUG",
        "OMP_NUM_THREADS": "2",
        "LC_ALL": "C.UTF-8",
    }
    for name, value in ours.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setenv("NGC_API_KEY", "passed-by-name")
    code = "import json, os; print('ENV', json.dumps(dict(os.environ)))"
    plan = _plan(code, HF_TOKEN="given-by-config")
    proc = EngineProcess("e", plan, tmp_path / "e.log", pass_env=["NGC_API_KEY", "UNSET_ONE"])
    proc.start()
    await _wait_exit(proc)
    line = next(x for x in (tmp_path / "e.log").read_text().splitlines() if x.startswith("ENV "))
    seen = json.loads(line.removeprefix("ENV "))
    for name in ("CONSUL_HTTP_TOKEN", "CREDENTIALS_DIRECTORY", "AWS_SECRET_ACCESS_KEY"):
        assert name not in seen
    assert seen["HF_TOKEN"] == "given-by-config"  # the config may add it explicitly
    assert seen["NGC_API_KEY"] == "passed-by-name"  # or name it in process.pass_env
    assert "UNSET_ONE" not in seen
    for name in ("HF_HUB_OFFLINE", "VLLM_LOGGING_LEVEL", "OMP_NUM_THREADS", "LC_ALL"):
        assert seen[name] == ours[name]
    assert seen["PATH"] == os.environ["PATH"]
    assert "registry-secret" not in (tmp_path / "e.log").read_text().replace(line, "")


def test_an_engine_inherits_opentelemetry_settings_but_not_a_collectors_headers() -> None:
    ours = {
        "OTEL_EXPORTER_OTLP_CERTIFICATE": "/etc/ssl/collector-ca.pem",
        "OTEL_BSP_MAX_EXPORT_BATCH_SIZE": "256",
        # Often a collector's API key ("authorization=Bearer ..."): only by name.
        "OTEL_EXPORTER_OTLP_HEADERS": "authorization=Bearer collector-secret",
        "OTEL_EXPORTER_OTLP_TRACES_HEADERS": "x-api-key=collector-secret",
        "OTEL_EXPORTER_OTLP_CLIENT_KEY": "/etc/ssl/client.key",
    }
    env = engine_environ({}, parent=ours)
    assert env == {
        k: ours[k] for k in ("OTEL_EXPORTER_OTLP_CERTIFICATE", "OTEL_BSP_MAX_EXPORT_BATCH_SIZE")
    }
    named = engine_environ({}, ["OTEL_EXPORTER_OTLP_HEADERS"], parent=ours)
    assert named["OTEL_EXPORTER_OTLP_HEADERS"] == ours["OTEL_EXPORTER_OTLP_HEADERS"]


@pytest.mark.anyio
async def test_stop_is_sigterm_first(tmp_path: Path) -> None:
    code = (
        "import signal, sys, time\n"
        "def bye(*_):\n    print('graceful', flush=True); sys.exit(0)\n"
        "signal.signal(signal.SIGTERM, bye)\n"
        "print('REA' + 'DY', flush=True)\n"
        "time.sleep(60)\n"
    )
    proc = EngineProcess("r", _plan(code), tmp_path / "r.log")
    proc.start()
    await _wait_log(tmp_path / "r.log", "READY")
    await proc.stop(timeout_s=10)
    assert not proc.alive
    assert proc.returncode == 0
    assert "graceful" in (tmp_path / "r.log").read_text()


@pytest.mark.anyio
async def test_stop_escalates_to_sigkill(tmp_path: Path) -> None:
    code = (
        "import signal, time\n"
        "signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
        "print('REA' + 'DY', flush=True)\n"
        "time.sleep(60)\n"
    )
    proc = EngineProcess("r", _plan(code), tmp_path / "r.log")
    proc.start()
    await _wait_log(tmp_path / "r.log", "READY")
    started = time.monotonic()
    await proc.stop(timeout_s=0.5)
    assert not proc.alive
    assert proc.returncode == -9
    assert time.monotonic() - started < 10


def test_missing_executable_is_a_launch_failure(tmp_path: Path) -> None:
    plan = ProcessCommand(("/nonexistent/vllm", "serve", "m"))
    proc = EngineProcess("r", plan, tmp_path / "r.log")
    with pytest.raises(LaunchFailed, match="cannot run '/nonexistent/vllm'"):
        proc.start()
    assert not proc.alive
    assert "cannot start" in (tmp_path / "r.log").read_text()


async def _wait_exit(proc: EngineProcess) -> None:
    for _ in range(200):
        if not proc.alive:
            return
        await asyncio.sleep(0.05)
    raise AssertionError("process did not exit")


def _contains(path: Path, text: str) -> bool:
    return path.exists() and text in path.read_text()


async def _wait_log(path: Path, text: str) -> None:
    for _ in range(200):
        if await asyncio.to_thread(_contains, path, text):
            return
        await asyncio.sleep(0.05)
    raise AssertionError(f"{text!r} never appeared in {path}")


@pytest.mark.anyio
async def test_supervisor_restarts_after_an_exit_and_stop_reaps_the_session(
    tmp_path: Path,
) -> None:
    """A leader that exits leaves a worker behind (as vLLM's engine core can); stop kills it."""
    pidfile = tmp_path / "worker.pid"
    code = (
        "import subprocess, sys\n"
        "w = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)'])\n"
        f"open({str(pidfile)!r}, 'w').write(str(w.pid))\n"
        "print('REA' + 'DY', flush=True)\n"
    )
    settings = ProcessSettings(restart_backoff_initial_s=0.05, startup_timeout_s=5)
    sup = ProcessSupervisor(EngineProcess("r", _plan(code), tmp_path / "r.log"), settings)
    await sup.launch()
    await _wait_exit(sup.process)
    worker = int(pidfile.read_text())
    assert _running(worker)
    delay = sup.next_delay()
    assert delay == pytest.approx(0.05)
    assert sup.last_exit == 0
    await sup.stop()
    for _ in range(100):
        if not _running(worker):
            break
        await asyncio.sleep(0.05)
    assert not _running(worker)
    await sup.relaunch(delay)
    assert sup.restarts == 1
    await _wait_exit(sup.process)
    await sup.stop()
    assert (tmp_path / "r.log").read_text().count("--- ") == 2


def _running(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A zombie (exited, not yet reaped by its parent) counts as gone.
    stat = Path(f"/proc/{pid}/stat")
    return stat.exists() and stat.read_text().split()[2] != "Z"
