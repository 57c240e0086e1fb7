"""The supervisor with real subprocesses: readiness, restart with backoff, clean stop."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import os
import socket
import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import pytest

from hybrid_llm.local.servers import REPO, free_port, probe_all, wait_ready
from hybrid_llm.local.supervisor import ProcessSpec, StartupError, Supervisor


def _tiny(name: str, *extra: str) -> tuple[ProcessSpec, str]:
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    spec = ProcessSpec(
        name=name,
        argv=[sys.executable, "-m", "tests.hybrid_llm.tiny_server", "--port", str(port), *extra],
        env={"PYTHONPATH": str(REPO)},
        cwd=REPO,
        ready_url=url + "/ready",
        ready_timeout=20,
    )
    return spec, url


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A zombie still answers kill(0); it is gone for our purposes.
    with contextlib.suppress(OSError):
        return Path(f"/proc/{pid}/stat").read_text().split()[2] != "Z"
    return False


@contextlib.asynccontextmanager
async def _running(sup: Supervisor) -> AsyncIterator[asyncio.Task[None]]:
    await sup.start()
    watcher = asyncio.create_task(sup.watch())
    try:
        yield watcher
    finally:
        await sup.stop()
        await asyncio.wait_for(watcher, 10)


@pytest.mark.anyio
async def test_starts_in_order_waits_ready_and_stops_cleanly(tmp_path: Path) -> None:
    a, a_url = _tiny("a", "--ready-after", "0.5")
    b, b_url = _tiny("b")
    events: list[str] = []
    sup = Supervisor([a, b], tmp_path, on_event=events.append)
    async with _running(sup), httpx.AsyncClient() as client:
        assert (await client.get(a_url + "/ready")).status_code == 200
        pids = [int((await client.get(u + "/pid")).text) for u in (a_url, b_url)]
        # Each runs under its lifeline watcher, which leads the child's group.
        groups = [c.pid for c in sup.children]
        assert [os.getpgid(p) for p in pids] == groups
    assert events[:2] == [f"a ready (pid {groups[0]})", f"b ready (pid {groups[1]})"]
    assert events[-2:] == ["b stopped", "a stopped"]  # reverse order
    assert not any(_alive(p) for p in pids)
    assert "tiny_server on" in (tmp_path / "a.log").read_text()


@pytest.mark.anyio
async def test_crashed_child_is_restarted_with_backoff(tmp_path: Path) -> None:
    a, url = _tiny("a")
    events: list[str] = []
    sup = Supervisor([a], tmp_path, backoff_initial=0.2, on_event=events.append)
    async with _running(sup), httpx.AsyncClient() as client:
        first = int((await client.get(url + "/pid")).text)
        group = sup.children[0].pid
        with contextlib.suppress(httpx.HTTPError):
            await client.get(url + "/crash")
        for _ in range(100):
            await asyncio.sleep(0.1)
            if sup.children[0].ready and sup.children[0].pid != group:
                break
        second = int((await client.get(url + "/pid")).text)
        assert second != first
        assert sup.children[0].restarts == 1
    assert any("a exited with 3; restarting in 0.2s" in e for e in events)


@pytest.mark.anyio
async def test_startup_failure_names_the_child_and_stops_the_rest(tmp_path: Path) -> None:
    good, _ = _tiny("good")
    bad, _ = _tiny("bad", "--fail-start")
    sup = Supervisor([good, bad], tmp_path)
    with pytest.raises(StartupError, match=r"bad exited with 4 while starting(.|\n)*refusing"):
        await sup.start()
    pid = sup.children[0].pid
    assert pid is not None
    assert not _alive(pid)


@pytest.mark.anyio
async def test_child_ignoring_sigterm_is_killed(tmp_path: Path) -> None:
    stubborn, _ = _tiny("stubborn", "--ignore-term")
    events: list[str] = []
    sup = Supervisor([stubborn], tmp_path, stop_timeout=0.5, on_event=events.append)
    async with _running(sup):
        pid = sup.children[0].pid
    assert "stubborn ignored SIGTERM; killing" in events
    assert pid is not None
    assert not _alive(pid)


@pytest.mark.anyio
@pytest.mark.parametrize("flags", [(), ("--ignore-term",)], ids=["exits", "killed"])
async def test_workers_in_their_own_session_do_not_outlive_the_stop(
    tmp_path: Path, flags: tuple[str, ...]
) -> None:
    spec, url = _tiny("gateway", "--worker-session", *flags)
    events: list[str] = []
    sup = Supervisor([spec], tmp_path, stop_timeout=0.5, on_event=events.append)
    async with _running(sup):
        async with httpx.AsyncClient() as client:
            worker = int((await client.get(url + "/worker")).text)
        assert _alive(worker)
    for _ in range(50):  # SIGKILL is delivered at once; reaping by init may lag
        if not _alive(worker):
            break
        await asyncio.sleep(0.05)
    assert not _alive(worker)
    assert "gateway left 1 process(es) behind; killed" in events


def _squat(port: int) -> socket.socket:
    squatter = socket.socket()
    squatter.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    squatter.bind(("127.0.0.1", port))
    squatter.listen()
    return squatter


def _with_port(spec: ProcessSpec, url: str) -> ProcessSpec:
    return dataclasses.replace(spec, ports=(int(url.rsplit(":", 1)[1]),))


@pytest.mark.anyio
async def test_a_child_that_cannot_bind_is_named_with_the_holder_at_start(tmp_path: Path) -> None:
    spec, url = _tiny("a")
    spec = _with_port(spec, url)
    with _squat(spec.ports[0]):
        sup = Supervisor([spec], tmp_path)
        with pytest.raises(StartupError) as caught:
            await sup.start()
    assert str(caught.value).startswith(
        f"a cannot bind port {spec.ports[0]} (held by pid {os.getpid()} ("
    )


@pytest.mark.anyio
async def test_a_child_that_cannot_bind_is_not_restarted_in_a_loop(tmp_path: Path) -> None:
    spec, url = _tiny("a")
    spec = _with_port(spec, url)
    events: list[str] = []
    sup = Supervisor([spec], tmp_path, backoff_initial=0.5, on_event=events.append)
    async with _running(sup), httpx.AsyncClient() as client:
        with contextlib.suppress(httpx.HTTPError):
            await client.get(url + "/crash")
        for _ in range(100):  # the crash is seen (and restart is due in 0.5 s)
            if any("restarting in" in e for e in events):
                break
            await asyncio.sleep(0.02)
        squatter = _squat(spec.ports[0])
        with squatter:
            for _ in range(100):
                if sup.children[0].failed:
                    break
                await asyncio.sleep(0.1)
            await asyncio.sleep(1.5)  # past the next backoff: no further attempt
    assert sup.children[0].restarts == 1
    blocked = [e for e in events if "cannot bind" in e]
    assert len(blocked) == 1
    assert blocked[0].startswith(f"a cannot bind port {spec.ports[0]} (held by pid {os.getpid()}")
    assert blocked[0].endswith("; not restarting it")
    assert not any("restarting in" in e for e in events[events.index(blocked[0]) :])


def test_wait_ready_waits_for_200_and_names_why_it_gave_up() -> None:
    """The tools' synchronous wait asks through the shared probe: a 503 is not ready,
    a port nobody holds says "refused", and a process that exited ends the wait."""
    spec, url = _tiny("slow", "--ready-after", "0.6")
    proc = subprocess.Popen(spec.argv, env={**os.environ, **spec.env}, cwd=spec.cwd)
    try:
        assert probe_all([url + "/ready"])[0].status in (None, 503)
        wait_ready(url, timeout=20)
        assert probe_all([url + "/ready"])[0].up
    finally:
        proc.terminate()
        proc.wait()
    nobody = f"http://127.0.0.1:{free_port()}"
    with pytest.raises(TimeoutError, match="refused"):
        wait_ready(nobody, timeout=0.3)
    with pytest.raises(RuntimeError, match="exited"):
        wait_ready(nobody, timeout=20, alive=lambda: False)


@pytest.mark.anyio
async def test_wait_ready_also_waits_from_a_running_event_loop() -> None:
    """An async test may wait for a server it started: the wait blocks, as a sync GET did."""
    with pytest.raises(TimeoutError, match="refused"):
        wait_ready(f"http://127.0.0.1:{free_port()}", timeout=0.3)
    assert not probe_all([f"http://127.0.0.1:{free_port()}/ready"])[0].up
