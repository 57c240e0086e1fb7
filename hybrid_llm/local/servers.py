"""Real-socket servers on one machine: an ASGI app under uvicorn in a thread,
or a service started as a subprocess and waited on until ``/ready``.

Tests and the studies under ``studies/`` start their servers through these.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Coroutine, Iterator, Sequence
from pathlib import Path
from typing import IO, Any, TypeVar

import httpx
import uvicorn

from servekit.engine.process import free_port
from servekit.health_probe import Health, probe_health

__all__ = [
    "REPO",
    "UvicornThread",
    "all_replicas_healthy",
    "free_port",
    "gateway_replicas",
    "probe_all",
    "service_process",
    "wait_ready",
    "wait_until",
]

_T = TypeVar("_T")

# The checkout (the package is installed editable): services run from here.
REPO = Path(__file__).resolve().parents[2]


class UvicornThread:
    """Serve an ASGI app on 127.0.0.1 in a background thread (lifespan included)."""

    def __init__(self, app: Any, port: int | None = None, **config: Any) -> None:
        self.port = port or free_port()
        cfg = uvicorn.Config(
            app, host="127.0.0.1", port=self.port, log_level="warning", lifespan="on", **config
        )
        self.server = uvicorn.Server(cfg)
        self.thread = threading.Thread(target=self.server.run, daemon=True)

    @property
    def url(self) -> str:
        scheme = "https" if self.server.config.ssl_certfile else "http"
        return f"{scheme}://127.0.0.1:{self.port}"

    def __enter__(self) -> UvicornThread:
        self.thread.start()
        deadline = time.monotonic() + 120
        while not self.server.started:
            if not self.thread.is_alive():
                raise RuntimeError("uvicorn exited during startup")
            if time.monotonic() > deadline:
                raise TimeoutError("uvicorn did not start")
            time.sleep(0.02)
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=30)


def wait_ready(
    url: str,
    timeout: float = 180.0,
    path: str = "/ready",
    verify: Any = True,
    alive: Callable[[], bool] | None = None,
) -> None:
    """Until ``url + path`` answers 200; ``verify`` is httpx's (a CA file or SSLContext);
    ``alive`` false (the process exited) ends the wait at once.

    Each check is :func:`servekit.health_probe.probe_health`, as the supervisor's."""
    deadline = time.monotonic() + timeout
    _run(lambda: _wait_ready(url + path, deadline, verify, alive))


async def _wait_ready(
    url: str, deadline: float, verify: Any, alive: Callable[[], bool] | None
) -> None:
    last = "no answer yet"
    async with httpx.AsyncClient(timeout=2.0, verify=verify) as client:
        while time.monotonic() < deadline:
            if alive is not None and not alive():
                raise RuntimeError(f"{url}: the service exited while starting")
            health = await probe_health(client, url)
            if health.up:
                return
            last = health.reason
            await asyncio.sleep(0.1)
    raise TimeoutError(f"{url} not ready in time (last: {last})")


def _run(make: Callable[[], Coroutine[Any, Any, _T]]) -> _T:
    """``make()`` run to its end from synchronous code, also when the caller is itself
    on an event loop (an async test that waits for a server: blocking, as a sync GET)."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(make())
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        return pool.submit(lambda: asyncio.run(make())).result()


def probe_all(urls: Sequence[str], timeout: float = 2.0) -> list[Health]:
    """One :func:`~servekit.health_probe.probe_health` of each URL, all at once."""

    async def probe() -> list[Health]:
        async with httpx.AsyncClient(timeout=timeout) as client:
            return list(await asyncio.gather(*(probe_health(client, u) for u in urls)))

    return _run(probe)


def wait_until(
    predicate: Callable[[], bool],
    timeout: float = 10.0,
    what: str = "condition",
    interval: float = 0.05,
) -> None:
    """Poll ``predicate`` until it holds; AssertionError naming ``what`` after ``timeout``."""
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() >= deadline:
            raise AssertionError(f"timed out after {timeout:g}s waiting for {what}")
        time.sleep(interval)


def gateway_replicas(url: str, headers: dict[str, str] | None = None) -> dict[str, dict[str, Any]]:
    """A central gateway's ``/replicas``, by replica name."""
    body = httpx.get(url + "/replicas", headers=headers, timeout=5).json()
    return {r["name"]: r for r in body["replicas"]}


def all_replicas_healthy(url: str) -> bool:
    return all(r["state"] == "healthy" for r in gateway_replicas(url).values())


@contextlib.contextmanager
def service_process(
    args: Sequence[str],
    url: str,
    *,
    ready_timeout: float = 180.0,
    env: dict[str, str] | None = None,
    verify: Any = True,
    stderr: IO[bytes] | None = None,
) -> Iterator[subprocess.Popen[bytes]]:
    """Run ``python -m <args>`` from the repo root and wait for ``url/ready``
    (its log to ``stderr`` if given)."""
    full_env = dict(os.environ)
    full_env["PYTHONPATH"] = str(REPO) + os.pathsep + full_env.get("PYTHONPATH", "")
    if env:
        full_env.update(env)
    proc = subprocess.Popen(
        [sys.executable, "-m", *args],
        cwd=REPO,
        env=full_env,
        start_new_session=True,
        stderr=stderr,
    )
    try:
        try:
            wait_ready(url, ready_timeout, verify=verify)
        except TimeoutError:
            if proc.poll() is not None:
                raise RuntimeError(f"{args} exited with {proc.returncode}") from None
            raise
        yield proc
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
