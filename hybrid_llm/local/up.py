"""``hybrid-llm up`` / ``down`` / ``status``: the whole local topology with one command.

``up`` fetches missing models, starts every service of the topology under the
supervisor, waits until each is ready, prints what runs where with a
ready-to-paste ``curl`` and ``openai`` example, then keeps the children alive
(restarting crashed ones) until Ctrl-C, SIGTERM or ``hybrid-llm down``.

Only one ``up`` runs per state directory (:mod:`hybrid_llm.local.runstate`:
a lock, and a state file with every child's pid, start time and ports written
as each starts). A second ``up`` refuses, naming the pids and ports, and so
does one that finds services a dead supervisor left or a port taken by some
other process; ``down`` works from another shell and stops what a dead
supervisor left. The children die with the supervisor anyway (lifelines), and
its console survives a closed pipe (:mod:`hybrid_llm.local.output`).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from rich.console import Console
from rich.table import Table

from hybrid_llm.local.output import Output
from hybrid_llm.local.runstate import (
    STATE_FILE,
    RunLock,
    leftovers,
    port_conflicts,
    read_state,
    running_message,
    stop_leftovers,
    supervisor_running,
    write_state,
)
from hybrid_llm.local.supervisor import ProcessSpec, StartupError, Supervisor
from hybrid_llm.local.topology import (
    LOCAL_TRACES,
    TopologyError,
    TopologySettings,
    build_specs,
    service_token_path,
    signing_key_paths,
    with_services,
)

__all__ = ["register"]

DEFAULT_CONFIG = Path("configs/local.yaml")


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
        "--with",
        dest="also",
        action="append",
        default=[],
        metavar="NAME",
        help="also start this service the config leaves off (e.g. router-2: a second router)",
    )
    up.add_argument(
        "--center",
        default=None,
        help="the center's engine: a variant of the center service, e.g. `vllm` "
        "(two vllm serve replicas; needs `scripts/setup.sh --vllm`)",
    )
    up.add_argument(
        "--tracing",
        metavar="URL",
        nargs="?",
        const=LOCAL_TRACES,
        default=None,
        help="trace every request: alone, start the topology's own trace store (Arize "
        "Phoenix, web UI on 127.0.0.1:6006; needs `scripts/setup.sh --phoenix`) and export "
        "every router's, edge's and center's spans to it; with a URL, export them to that "
        "OTLP/HTTP endpoint instead (e.g. http://127.0.0.1:4318/v1/traces of a collector)",
    )
    up.set_defaults(func=_up)
    down = sub.add_parser("down", help="stop a topology started by `hybrid-llm up`")
    down.add_argument("--config", type=Path, default=DEFAULT_CONFIG)
    down.add_argument("--timeout", type=float, default=60.0)
    down.set_defaults(func=_down)
    status = sub.add_parser("status", help="what `hybrid-llm up` runs, and whether it is ready")
    status.add_argument("--config", type=Path, default=DEFAULT_CONFIG)
    status.set_defaults(func=_status)


def _load(
    path: Path,
    netem: bool | None = None,
    center: str | None = None,
    also: Sequence[str] = (),
    tracing: str | None = None,
) -> TopologySettings:
    from servekit.config import ConfigError, load_settings

    overrides = {"netem.enabled": netem, "center": center, "tracing": tracing}
    topo = load_settings(TopologySettings, path, **overrides)
    try:
        return with_services(topo, also)
    except ValueError as exc:
        raise ConfigError(f"{path}: --with {', '.join(also)}: {exc}") from None


def _pid_path(topo: TopologySettings) -> Path:
    return topo.state_dir / STATE_FILE


def _fetch(topo: TopologySettings, out: Output) -> None:
    from servekit.modelfetch import BUNDLED_MODELS, fetch_model

    for name in topo.models:
        model = BUNDLED_MODELS[name]
        if (topo.models_dir / model.filename).is_file():
            continue
        out.say(f"fetching {name} into {topo.models_dir} ...")
        fetch_model(model, topo.models_dir, log=lambda m: out.say(f"[dim]{m}"))


def _up(args: argparse.Namespace) -> int:
    from servekit.config import ConfigError

    out = Output()
    try:
        topo = _load(args.config, args.netem, args.center, args.also, args.tracing)
    except ConfigError as exc:
        out.say(f"[red]{exc}")
        return 2
    pid_path = _pid_path(topo)
    lock = RunLock(topo.state_dir)
    if not lock.acquire():
        out.say(
            f"[red]already running ({running_message(read_state(pid_path))}); "
            "`hybrid-llm down` first"
        )
        return 1
    try:
        state = read_state(pid_path)
        left = leftovers(state) if state is not None else []
        if left:
            assert state is not None
            out.say(
                f"[red]a `hybrid-llm up` (pid {state.get('pid')}) that is gone left these "
                f"running: {', '.join(map(str, left))}; `hybrid-llm down` stops them"
            )
            return 1
        if args.detach:
            lock.release()  # the detached supervisor takes it
            return _detach(args, topo, out)
        if not args.no_fetch:
            _fetch(topo, out)
        root = Path.cwd()
        try:
            specs = build_specs(topo, root)
        except TopologyError as exc:
            out.say(f"[red]{exc}")
            return 2
        taken = port_conflicts(specs)
        if taken:
            out.say("[red]cannot start: " + "; ".join(taken))
            return 1
        return _supervise(args, topo, specs, out)
    finally:
        lock.release()


def _supervise(
    args: argparse.Namespace, topo: TopologySettings, specs: list[ProcessSpec], out: Output
) -> int:
    pid_path = _pid_path(topo)
    pid_path.parent.mkdir(parents=True, exist_ok=True)
    sup: Supervisor | None = None

    def record() -> None:
        write_state(pid_path, sup, sup is not None and sup.started, args.config)

    def on_event(message: str) -> None:
        out.say(f"[dim]{time.strftime('%H:%M:%S')} {message}")
        record()

    sup = Supervisor(
        specs,
        Path.cwd() / topo.state_dir / "log",
        on_event=on_event,
        on_spawn=lambda _child: record(),
    )
    record()
    try:
        return asyncio.run(_serve(sup, topo, out, record))
    finally:
        with contextlib.suppress(FileNotFoundError):
            pid_path.unlink()


async def _serve(
    sup: Supervisor, topo: TopologySettings, out: Output, record: Callable[[], None]
) -> int:
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
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
        out.say(f"[red]{exc}")
        return 1
    record()
    _print_ready(topo, sup, out)
    watcher = asyncio.create_task(sup.watch())
    await stop.wait()
    out.say("stopping ...")
    await sup.stop()
    await watcher
    return 0


def _print_ready(topo: TopologySettings, sup: Supervisor, out: Output) -> None:
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
    out.show(table)
    router = topo.router()
    base = topo.url(router) if router else None
    if base:
        out.plain(_examples(base, topo.example_api_key))
    token = service_token_path(topo.state_dir)
    center_token = service_token_path(topo.state_dir, "center")
    if token.is_file():
        out.show(
            f"The edges accept only the service token in {token}, the center only the one "
            f"in {center_token} (the router sends each its own): "
            f'curl -H "Authorization: Bearer $(cat {token})" ...',
            highlight=False,
        )
    key, _ = signing_key_paths(topo.state_dir)
    if key.is_file():
        out.show(
            f"The edges load only versions signed with {key}: "
            f"model-sync --registry-db {topo.registry} --signing-key-file {key} push ...",
            highlight=False,
        )
    store = topo.trace_store()
    if store is not None:
        out.show(
            f"Traces: open {topo.url(store)} (Arize Phoenix, project `default`): every "
            f"router's, edge's and center's spans arrive at {topo.trace_endpoint()}; its "
            f"database is under {topo.state_dir / 'phoenix'}.",
            highlight=False,
        )
    elif topo.tracing is not None:
        out.show(
            f"Traces of the router, edges and center go to {topo.tracing}; each answer's "
            "Server-Timing header shows the router's stages.",
            highlight=False,
        )
    out.show("Stop with Ctrl-C here, or `hybrid-llm down` from another shell.")


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


def _detach(args: argparse.Namespace, topo: TopologySettings, out: Output) -> int:
    log_dir = topo.state_dir / "log"
    log_dir.mkdir(parents=True, exist_ok=True)
    argv = [sys.executable, "-m", "hybrid_llm", "up", "--config", str(args.config)]
    if args.netem is not None:
        argv.append("--netem" if args.netem else "--no-netem")
    if args.no_fetch:
        argv.append("--no-fetch")
    if args.center is not None:
        argv += ["--center", args.center]
    for name in args.also:
        argv += ["--with", name]
    if args.tracing is not None:
        argv += ["--tracing", args.tracing]
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
            out.say(f"[red]`hybrid-llm up` exited with {proc.returncode}; see {log_dir}/up.log")
            return 1
        data = read_state(pid_path)
        if data and data.get("ready") and data.get("pid") == proc.pid:
            return _status(args)
        time.sleep(0.3)
    out.say(f"[red]not ready after 900 s; see {log_dir}/up.log")
    return 1


def _down(args: argparse.Namespace) -> int:
    console = Console(stderr=True)
    topo = _load(args.config)
    pid_path = _pid_path(topo)
    data = read_state(pid_path)
    if data is None:
        console.print("nothing is running (no state file)")
        return 0
    pid = int(data.get("pid", 0))
    if supervisor_running(data):
        os.kill(pid, signal.SIGTERM)
        deadline = time.monotonic() + args.timeout
        while supervisor_running(data) and time.monotonic() < deadline:
            time.sleep(0.2)
        if supervisor_running(data):
            console.print(f"[yellow]supervisor {pid} still running after {args.timeout:.0f}s")
            return 1
    # Whatever outlived its supervisor (killed with its lifelines, or crashed) goes now.
    for left in stop_leftovers(leftovers(data)):
        console.print(f"stopped orphan {left}")
    with contextlib.suppress(FileNotFoundError):
        pid_path.unlink()
    console.print("stopped")
    return 0


def _status(args: argparse.Namespace) -> int:
    from hybrid_llm.local.servers import probe_all

    topo = _load(args.config)
    data = read_state(_pid_path(topo))
    console = Console(width=max(Console().width, 160))
    if data is None or not supervisor_running(data):
        console.print("not running")
        return 3
    table = Table(title=f"hybrid-llm (supervisor pid {data['pid']}, {data['config']})")
    for col in ("service", "kind", "region", "url", "emulated RTT ms", "pid", "restarts", "ready"):
        table.add_column(col)
    children = data.get("children", [])
    probed = iter(probe_all([c["ready_url"] for c in children if c.get("ready_url")]))
    for c in children:
        ready = "-"
        if c.get("ready_url"):
            health = next(probed)
            ready = "true" if health.up else f"false ({health.reason})"
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
