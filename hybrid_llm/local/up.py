"""``hybrid-llm up`` / ``down`` / ``status``: the whole local topology with one command.

``up`` fetches missing models, starts every service of the topology under the
supervisor, waits until each is ready, prints what runs where with a
ready-to-paste ``curl`` and ``openai`` example, then keeps the children alive
(restarting crashed ones) until Ctrl-C, SIGTERM or ``hybrid-llm down``. The
pid file (``<state_dir>/hybrid-llm.json``) records the supervisor and its
children, so ``down`` works from another shell and cleans up after a
supervisor that died.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from hybrid_llm.local.supervisor import StartupError, Supervisor
from hybrid_llm.local.topology import (
    TopologyError,
    TopologySettings,
    build_specs,
    service_token_path,
)

__all__ = ["register"]

DEFAULT_CONFIG = Path("configs/local.yaml")
PID_FILE = "hybrid-llm.json"


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    up = sub.add_parser("up", help="start the local topology (router, edges, center, ...)")
    up.add_argument("--config", type=Path, default=DEFAULT_CONFIG)
    up.add_argument(
        "--detach", action="store_true", help="run in the background; return once ready"
    )
    up.add_argument(
        "--netem",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="emulate inter-region RTT on router->upstream hops (overrides the config)",
    )
    up.add_argument("--no-fetch", action="store_true", help="do not fetch missing models")
    up.add_argument(
        "--center",
        default=None,
        help="the center's engine: a variant of the center service, e.g. `vllm` "
        "(two vllm serve replicas; needs `scripts/setup.sh --vllm`)",
    )
    up.set_defaults(func=_up)
    down = sub.add_parser("down", help="stop a topology started by `hybrid-llm up`")
    down.add_argument("--config", type=Path, default=DEFAULT_CONFIG)
    down.add_argument("--timeout", type=float, default=60.0)
    down.set_defaults(func=_down)
    status = sub.add_parser("status", help="what `hybrid-llm up` runs, and whether it is ready")
    status.add_argument("--config", type=Path, default=DEFAULT_CONFIG)
    status.set_defaults(func=_status)


def _load(path: Path, netem: bool | None = None, center: str | None = None) -> TopologySettings:
    from servekit.config import load_settings

    return load_settings(TopologySettings, path, **{"netem.enabled": netem, "center": center})


def _pid_path(topo: TopologySettings) -> Path:
    return topo.state_dir / PID_FILE


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _read_pid_file(path: Path) -> dict[str, Any] | None:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def _write_pid_file(path: Path, sup: Supervisor | None, ready: bool, config: Path) -> None:
    children = []
    if sup is not None:
        for c in sup.children:
            children.append(
                {
                    "name": c.spec.name,
                    "pid": c.pid,
                    **c.spec.labels,
                    "ready_url": c.spec.ready_url,
                    "restarts": c.restarts,
                }
            )
    data = {"pid": os.getpid(), "config": str(config), "ready": ready, "children": children}
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(data, indent=1), encoding="utf-8")
    os.replace(tmp, path)


def _fetch(topo: TopologySettings, console: Console) -> None:
    from servekit.modelfetch import BUNDLED_MODELS, fetch_model

    for name in topo.models:
        model = BUNDLED_MODELS[name]
        if (topo.models_dir / model.filename).is_file():
            continue
        console.print(f"fetching {name} into {topo.models_dir} ...")
        fetch_model(model, topo.models_dir, log=lambda m: console.print(f"[dim]{m}"))


def _up(args: argparse.Namespace) -> int:
    from servekit.config import ConfigError

    console = Console(stderr=True)
    try:
        topo = _load(args.config, args.netem, args.center)
    except ConfigError as exc:
        console.print(f"[red]{exc}")
        return 2
    pid_path = _pid_path(topo)
    existing = _read_pid_file(pid_path)
    if existing and _alive(int(existing.get("pid", 0))):
        console.print(f"[red]already running (pid {existing['pid']}); `hybrid-llm down` first")
        return 1
    if args.detach:
        return _detach(args, topo, console)
    if not args.no_fetch:
        _fetch(topo, console)
    root = Path.cwd()
    try:
        specs = build_specs(topo, root)
    except TopologyError as exc:
        console.print(f"[red]{exc}")
        return 2
    pid_path.parent.mkdir(parents=True, exist_ok=True)
    sup: Supervisor | None = None

    def on_event(message: str) -> None:
        console.print(f"[dim]{time.strftime('%H:%M:%S')} {message}")
        _write_pid_file(pid_path, sup, sup is not None and sup.started, args.config)

    sup = Supervisor(specs, root / topo.state_dir / "log", on_event=on_event)
    _write_pid_file(pid_path, sup, False, args.config)
    try:
        return asyncio.run(_serve(sup, topo, pid_path, args.config))
    finally:
        with contextlib.suppress(FileNotFoundError):
            pid_path.unlink()


async def _serve(sup: Supervisor, topo: TopologySettings, pid_path: Path, config: Path) -> int:
    console = Console(stderr=True)
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    start = asyncio.create_task(sup.start())
    stopper = asyncio.create_task(stop.wait())
    await asyncio.wait([start, stopper], return_when=asyncio.FIRST_COMPLETED)
    if stop.is_set() and not start.done():
        start.cancel()
        with contextlib.suppress(asyncio.CancelledError, StartupError):
            await start
        await sup.stop()
        return 130
    stopper.cancel()
    try:
        start.result()
    except StartupError as exc:
        console.print(f"[red]{exc}")
        return 1
    _write_pid_file(pid_path, sup, True, config)
    _print_ready(topo, sup, Console(width=max(Console().width, 160)))
    watcher = asyncio.create_task(sup.watch())
    await stop.wait()
    console.print("stopping ...")
    await sup.stop()
    await watcher
    return 0


def _print_ready(topo: TopologySettings, sup: Supervisor, console: Console) -> None:
    table = Table(title="hybrid-llm up: the local topology")
    for col in ("service", "kind", "region", "url", "emulated RTT ms", "pid", "log"):
        table.add_column(col)
    for c in sup.children:
        labels = c.spec.labels
        table.add_row(
            c.spec.name,
            labels.get("kind", "-"),
            labels.get("region", "-"),
            labels.get("url", "-"),
            labels.get("rtt_ms", "-"),
            str(c.pid),
            str(c.log_path),
        )
    console.print(table)
    router = topo.router()
    base = topo.url(router) if router else None
    if base:
        print(
            _examples(base, topo.example_api_key), flush=True
        )  # plain: rich would wrap the one-liners
    token = service_token_path(topo.state_dir)
    if token.is_file():
        console.print(
            f"Edges and the center accept only the service token in {token} (the router "
            f'sends it): curl -H "Authorization: Bearer $(cat {token})" ...',
            highlight=False,
        )
    console.print("Stop with Ctrl-C here, or `hybrid-llm down` from another shell.")


def _examples(base: str, key: str) -> str:
    body = (
        '{"model": "auto", "stream": true, "max_tokens": 48, '
        '"messages": [{"role": "user", "content": "Name three rivers in China."}]}'
    )
    return (
        f"\ncurl:\n  curl -N {base}/v1/chat/completions -H 'Authorization: Bearer {key}' "
        f"-H 'Content-Type: application/json' -d '{body}'\n"
        f"\nopenai:\n"
        f"  python -c \"from openai import OpenAI; c = OpenAI(base_url='{base}/v1', "
        f"api_key='{key}'); r = c.chat.completions.create(model='auto', max_tokens=48, "
        f"messages=[{{'role': 'user', 'content': 'Say hello.'}}]); "
        f'print(r.choices[0].message.content)"\n'
    )


def _detach(args: argparse.Namespace, topo: TopologySettings, console: Console) -> int:
    log_dir = topo.state_dir / "log"
    log_dir.mkdir(parents=True, exist_ok=True)
    argv = [sys.executable, "-m", "hybrid_llm", "up", "--config", str(args.config)]
    if args.netem is not None:
        argv.append("--netem" if args.netem else "--no-netem")
    if args.no_fetch:
        argv.append("--no-fetch")
    if args.center is not None:
        argv += ["--center", args.center]
    with (log_dir / "up.log").open("ab") as log:
        proc = subprocess.Popen(
            argv,
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )
    pid_path = _pid_path(topo)
    deadline = time.monotonic() + 900
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            console.print(
                f"[red]`hybrid-llm up` exited with {proc.returncode}; see {log_dir}/up.log"
            )
            return 1
        data = _read_pid_file(pid_path)
        if data and data.get("ready") and data.get("pid") == proc.pid:
            return _status(args)
        time.sleep(0.3)
    console.print(f"[red]not ready after 900 s; see {log_dir}/up.log")
    return 1


def _down(args: argparse.Namespace) -> int:
    console = Console(stderr=True)
    topo = _load(args.config)
    pid_path = _pid_path(topo)
    data = _read_pid_file(pid_path)
    if data is None:
        console.print("nothing is running (no pid file)")
        return 0
    pid = int(data.get("pid", 0))
    if pid and _alive(pid):
        os.kill(pid, signal.SIGTERM)
        deadline = time.monotonic() + args.timeout
        while _alive(pid) and time.monotonic() < deadline:
            time.sleep(0.2)
        if _alive(pid):
            console.print(f"[yellow]supervisor {pid} still running after {args.timeout:.0f}s")
    # Whatever outlived its supervisor (it was killed, or crashed) goes now.
    for child in data.get("children", []):
        cpid = child.get("pid")
        if cpid and _alive(int(cpid)):
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(int(cpid), signal.SIGTERM)
            console.print(f"stopped orphan {child.get('name')} (pid {cpid})")
    with contextlib.suppress(FileNotFoundError):
        pid_path.unlink()
    console.print("stopped")
    return 0


def _status(args: argparse.Namespace) -> int:
    import httpx

    topo = _load(args.config)
    data = _read_pid_file(_pid_path(topo))
    console = Console(width=max(Console().width, 160))
    if data is None or not _alive(int(data.get("pid", 0))):
        console.print("not running")
        return 3
    table = Table(title=f"hybrid-llm (supervisor pid {data['pid']}, {data['config']})")
    for col in ("service", "kind", "region", "url", "emulated RTT ms", "pid", "restarts", "ready"):
        table.add_column(col)
    for c in data.get("children", []):
        ready = "-"
        if c.get("ready_url"):
            try:
                ready = str(httpx.get(c["ready_url"], timeout=2.0).status_code == 200).lower()
            except httpx.HTTPError:
                ready = "false"
        table.add_row(
            c["name"],
            c.get("kind", "-"),
            c.get("region", "-"),
            c.get("url", "-"),
            c.get("rtt_ms", "-"),
            str(c.get("pid")),
            str(c.get("restarts", 0)),
            ready,
        )
    console.print(table)
    router = topo.router()
    if router and topo.url(router):
        print(_examples(str(topo.url(router)), topo.example_api_key), flush=True)
    return 0
