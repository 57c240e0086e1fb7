"""``model-sync``: publish model versions and roll them out to edge nodes.

The registry comes from ``--config FILE`` (any service YAML with a
``registry:`` block; default ``$MODEL_SYNC_CONFIG``) or ``--registry-db PATH``
(an embedded store file). ``--json`` prints machine-readable output.
``push`` and ``sign`` sign version records with the operator's key
(``signing:`` in the file, ``--signing-key-file`` or
``$MODEL_SYNC_SIGNING_KEY_FILE``); ``keygen`` makes one.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import getpass
import json
import os
import signal
import sys
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path
from typing import Any

import httpx
from rich.console import Console
from rich.live import Live
from rich.progress import BarColumn, DownloadColumn, Progress, TransferSpeedColumn

from model_sync import ops, render
from model_sync.controller import Controller
from model_sync.download import DownloadError
from model_sync.gates import PrometheusGate
from model_sync.keys import InvalidName
from model_sync.plan import build_plan, parse_duration
from model_sync.records import GateSettings
from model_sync.settings import ModelSyncSettings, load
from model_sync.status import fleet_status
from model_sync.store import StoreError, SyncStore
from servekit.config import ConfigError
from servekit.peers import async_client
from servekit.registry import Registry, RegistryError, open_registry
from servekit.secrets import redact_url

__all__ = ["main"]

Command = Callable[[argparse.Namespace, Registry, SyncStore, Console], Awaitable[int | None]]


def _duration(text: str) -> float:
    try:
        return parse_duration(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="model-sync", description=__doc__)
    p.add_argument("--config", type=Path, default=os.environ.get("MODEL_SYNC_CONFIG") or None)
    p.add_argument("--registry-db", type=Path, help="embedded registry file (overrides --config)")
    p.add_argument("--json", action="store_true", help="JSON output")
    p.add_argument("--actor", default=None, help="name recorded in history (default: $USER)")
    p.add_argument(
        "--signing-key-file",
        default=os.environ.get("MODEL_SYNC_SIGNING_KEY_FILE") or None,
        help="operator's private key that push and sign sign with (signing.key_file)",
    )
    p.add_argument(
        "--signing-key-env",
        default=None,
        help="environment variable holding that key's PEM text (signing.key_env)",
    )
    sub = p.add_subparsers(dest="command", required=True)

    s = sub.add_parser("push", help="hash an artifact (file or model directory) as a version")
    s.add_argument("source", help="GGUF file, HF model directory, or a file's http(s):// URL")
    s.add_argument(
        "--url", default=None, help="where nodes fetch it, if not SOURCE (its artifact-server URL)"
    )
    s.add_argument("--model", required=True)
    s.add_argument("--version", required=True)
    s.add_argument("--format", choices=["gguf", "hf", "awq", "fp8", "gptq"], default=None)
    s.add_argument("--tier", choices=["edge", "center"], default="edge")
    s.add_argument("--notes", default="")
    s.add_argument("--filename", default=None, help="file name on the nodes (default: source's)")

    s = sub.add_parser("sign", help="sign registered versions with the operator's key")
    s.add_argument("model")
    s.add_argument("versions", nargs="*", help="default: every registered version")

    s = sub.add_parser("keygen", help="make an operator signing key (ed25519)")
    s.add_argument("--out", type=Path, required=True, help="directory for NAME.key and NAME.pub")
    s.add_argument("--name", default="operator")

    s = sub.add_parser("list", help="registered versions, aliases and traffic")
    s.add_argument("model", nargs="?")

    s = sub.add_parser("rollout", help="start a staged rollout")
    s.add_argument("model")
    s.add_argument("version")
    s.add_argument("--canary", help="N nodes, N%% of the fleet, or node1,node2")
    s.add_argument("--waves", help="'by-region', or regions in order: eu,us")
    s.add_argument("--bake", type=_duration, default=60.0, help="bake per wave (90s, 5m)")
    s.add_argument("--converge-timeout", type=_duration, default=600.0)
    s.add_argument("--max-error-rate", type=float, default=None)
    s.add_argument("--max-error-rate-increase", type=float, default=None)
    s.add_argument("--max-ttft-ratio", type=float, default=None)
    s.add_argument("--min-requests", type=int, default=None)
    s.add_argument("--dry-run", action="store_true", help="show the plan, start nothing")
    s.add_argument(
        "--wait",
        action="store_true",
        help="follow until it ends; exit 0 if completed, 3 if rolled back or aborted",
    )

    s = sub.add_parser("status", help="rollout progress and every node's versions")
    s.add_argument("model", nargs="?")
    s.add_argument(
        "--watch", type=_duration, nargs="?", const=1.0, default=None, help="refresh (Ctrl-C ends)"
    )
    for name, text in (
        ("pause", "pause the active rollout"),
        ("resume", "resume a paused rollout (bakes the wave again)"),
        ("abort", "stop the rollout and roll touched nodes back"),
    ):
        s = sub.add_parser(name, help=text)
        s.add_argument("model")
        if name == "abort":
            s.add_argument("--reason", default="")
    s = sub.add_parser("promote", help="pass the current wave's gate now")
    s.add_argument("model")
    s.add_argument("--full", action="store_true", help="skip every remaining gate")
    s = sub.add_parser("rollback", help="every node back to the last good version, now")
    s.add_argument("model")
    s.add_argument("--to", default=None, help="version (default: the previous stable)")
    s = sub.add_parser("history", help="who did what, when")
    s.add_argument("model", nargs="?")
    s.add_argument("--limit", type=int, default=50)
    s = sub.add_parser("controller", help="run the rollout controller")
    s.add_argument("--tick", type=_duration, default=None)
    s = sub.add_parser("serve-artifacts", help="serve a directory over HTTP with Range support")
    s.add_argument("directory", type=Path)
    s.add_argument("--host", default="127.0.0.1")
    s.add_argument("--port", type=int, default=8600)
    s.add_argument("--tokens-file", help="accepted tokens, one per line (artifact_server.auth)")
    s.add_argument("--tokens-env", help="environment variable holding the accepted tokens")
    s.add_argument("--tls-cert", help="serve HTTPS with this certificate (artifact_server.tls)")
    s.add_argument("--tls-key", help="the certificate's key")
    s.add_argument(
        "--allow-unauthenticated",
        action="store_true",
        help="serve a non-loopback address without tokens (refused otherwise)",
    )
    s = sub.add_parser("node-policy", help="print a node's own Consul ACL policy")
    s.add_argument("node_id", help="the instance / node id (nodes/<id>/ in the KV)")
    s.add_argument("--consul-node", required=True, help="the Consul agent's node_name")
    return p


def _out(console: Console, args: argparse.Namespace, data: Any, human: Any = None) -> None:
    if args.json:
        print(json.dumps(data, indent=2, default=str))
    elif human is not None:
        console.print(human)


async def _push(
    args: argparse.Namespace, reg: Registry, store: SyncStore, c: Console, cfg: ModelSyncSettings
) -> None:
    signer = cfg.signing.signing_key()
    client = async_client(cfg.artifacts, timeout=httpx.Timeout(30.0, connect=10.0))
    progress = Progress(
        "[progress.description]{task.description}",
        BarColumn(),
        DownloadColumn(),
        TransferSpeedColumn(),
        console=Console(stderr=True),
        transient=True,
        disable=args.json,
    )
    async with client:
        with progress:
            task = progress.add_task(f"hashing {redact_url(args.source)}", total=None)
            record = await ops.push(
                store,
                args.source,
                model=args.model,
                version=args.version,
                fmt=args.format,
                tier=args.tier,
                notes=args.notes,
                filename=args.filename,
                url=args.url,
                progress=lambda done, total: progress.update(task, completed=done, total=total),
                client=client,
                signer=signer,
            )
    if signer is None and not args.json:
        Console(stderr=True).print(
            "[yellow]warning:[/] not signed (no signing key): edges that list "
            "model_sync.trusted_keys will refuse this version",
            highlight=False,
        )
    _out(
        c,
        args,
        record.model_dump(),
        f"registered {record.name} {record.version} "
        f"({render.size(record.size)}, sha256 {record.sha256[:12]}) from {record.uri}",
    )


async def _sign(
    args: argparse.Namespace, reg: Registry, store: SyncStore, c: Console, cfg: ModelSyncSettings
) -> None:
    signer = cfg.signing.signing_key()
    if signer is None:
        raise ConfigError("sign needs a key: --signing-key-file, or signing.key_file in --config")
    records = await ops.sign(store, signer, args.model, args.versions or None)
    _out(
        c,
        args,
        [r.model_dump() for r in records],
        "\n".join(
            f"signed {r.name} {r.version} (sha256 {r.sha256[:12]}, {r.uri}) with key {r.signed_by}"
            for r in records
        ),
    )


async def _list(args: argparse.Namespace, reg: Registry, store: SyncStore, c: Console) -> None:
    records = await store.artifacts(args.model)
    names = sorted({r.name for r in records})
    aliases = {n: await store.aliases(n) for n in names}
    shares = {n: (await store.traffic(n)).shares for n in names}
    data = [
        r.model_dump() | {"aliases": aliases[r.name], "traffic": shares[r.name]} for r in records
    ]
    _out(c, args, data, render.versions_table(records, aliases, shares))


async def _rollout(args: argparse.Namespace, reg: Registry, store: SyncStore, c: Console) -> int:
    gate_args = {
        "max_error_rate": args.max_error_rate,
        "max_error_rate_increase": args.max_error_rate_increase,
        "max_ttft_p95_ratio": args.max_ttft_ratio,
        "min_requests": args.min_requests,
    }
    gates = GateSettings.model_validate({k: v for k, v in gate_args.items() if v is not None})
    plan = await build_plan(
        reg,
        store,
        args.model,
        args.version,
        canary=args.canary,
        waves=args.waves,
        bake_s=args.bake,
        gates=gates,
        converge_timeout_s=args.converge_timeout,
    )
    if not args.dry_run:
        await ops.start_rollout(store, plan)
    _out(c, args, plan.model_dump(), render.plan_table(plan))
    if args.dry_run:
        return 0
    if not args.wait:
        if not args.json:
            c.print(f"started; the controller advances it (`model-sync status {args.model}`)")
        return 0
    return await _follow(store, args.model, plan.id, c, quiet=args.json)


async def _follow(store: SyncStore, model: str, rollout_id: str, c: Console, quiet: bool) -> int:
    """Print each history entry of the rollout until it ends; the exit code says how."""
    seen: set[str] = set()
    while True:
        state = await store.state(model)
        for entry in await store.history(model, limit=200):
            if entry.rollout_id == rollout_id and entry.id not in seen:
                seen.add(entry.id)
                if not quiet:
                    c.print(f"{render.when(entry.at)}  {entry.action}  {entry.detail}")
        if state is None or state.rollout_id != rollout_id or not state.active:
            break
        await asyncio.sleep(0.5)
    status = state.status if state else "unknown"
    if not quiet:
        c.print(
            f"rollout of {model} ended: {status}"
            + (f" ({state.reason})" if state and state.reason else "")
        )
    return 0 if status == "completed" else 3


async def _status(args: argparse.Namespace, reg: Registry, store: SyncStore, c: Console) -> int:
    status = await fleet_status(reg, store, args.model)
    if args.json:
        _out(c, args, status.to_dict())
    elif args.watch is None:
        c.print(render.status_view(status))
    else:
        with Live(render.status_view(status), console=c, auto_refresh=False) as live:
            while True:
                await asyncio.sleep(args.watch)
                status = await fleet_status(reg, store, args.model)
                live.update(render.status_view(status), refresh=True)
    return 0


async def _steer(args: argparse.Namespace, reg: Registry, store: SyncStore, c: Console) -> None:
    if args.command == "pause":
        state = await ops.pause(store, args.model)
    elif args.command == "resume":
        state = await ops.resume(store, args.model)
    elif args.command == "promote":
        state = await ops.promote(store, args.model, full=args.full)
    else:
        state = await ops.abort(store, args.model, args.reason)
    _out(
        c,
        args,
        state.model_dump(exclude={"outbox"}),
        f"{args.command}: {state.model} → {state.version} is now {state.status}",
    )


async def _rollback(args: argparse.Namespace, reg: Registry, store: SyncStore, c: Console) -> None:
    version = await ops.rollback(store, args.model, args.to)
    _out(
        c,
        args,
        {"model": args.model, "version": version},
        f"rolling {args.model} back to {version}",
    )


async def _history(args: argparse.Namespace, reg: Registry, store: SyncStore, c: Console) -> None:
    entries = await store.history(args.model, args.limit)
    _out(c, args, [e.model_dump() for e in entries], render.history_table(entries))


async def _controller(
    args: argparse.Namespace, reg: Registry, store: SyncStore, c: Console, cfg: ModelSyncSettings
) -> None:
    settings = cfg.controller
    peer = settings.prometheus.client if settings.prometheus is not None else None
    async with async_client(peer, timeout=30.0) as client:
        prometheus = None
        if settings.prometheus is not None:
            p = settings.prometheus
            prometheus = PrometheusGate(p.url, p.error_rate_query, p.ttft_p95_query, client)
        controller = Controller(
            reg,
            tick_s=args.tick or settings.tick_s,
            lock_ttl_s=settings.lock_ttl_s,
            prometheus=prometheus,
        )
        task = asyncio.ensure_future(controller.run())
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, task.cancel)
        c.print(f"[dim]controller {controller.holder} running", highlight=False)
        with contextlib.suppress(asyncio.CancelledError):
            await task


COMMANDS: dict[str, Command] = {
    "list": _list,
    "rollout": _rollout,
    "status": _status,
    "pause": _steer,
    "resume": _steer,
    "promote": _steer,
    "abort": _steer,
    "rollback": _rollback,
    "history": _history,
}


async def _run(args: argparse.Namespace, cfg: ModelSyncSettings, console: Console) -> int:
    registry = await open_registry(cfg.registry)
    try:
        store = SyncStore(registry, actor=args.actor or _whoami())
        if args.command == "controller":
            await _controller(args, registry, store, console, cfg)
            return 0
        if args.command == "push":
            await _push(args, registry, store, console, cfg)
            return 0
        if args.command == "sign":
            await _sign(args, registry, store, console, cfg)
            return 0
        return await COMMANDS[args.command](args, registry, store, console) or 0
    finally:
        await registry.aclose()


def _serve_artifacts(args: argparse.Namespace, err: Console) -> int:
    from model_sync.artifacts import create_app
    from servekit.serve import run_service
    from servekit.service_auth import TokenGate, is_loopback, warn_if_open
    from servekit.settings import ServerSettings
    from servekit.tls import ServerTLSSettings, client_ca_change

    overrides = {
        "artifact_server.auth.tokens_file": args.tokens_file,
        "artifact_server.auth.tokens_env": args.tokens_env,
        "artifact_server.tls.cert_file": args.tls_cert,
        "artifact_server.tls.key_file": args.tls_key,
    }
    try:
        server = load(args.config, **overrides).artifact_server
    except ConfigError as exc:
        err.print(f"[red]error:[/] {exc}", highlight=False)
        return 2
    if not args.directory.is_dir():
        err.print(f"[red]{args.directory} is not a directory")
        return 2
    gate = TokenGate(server.auth)
    if not gate.enabled and not is_loopback(args.host) and not args.allow_unauthenticated:
        err.print(
            f"[red]error:[/] refusing to serve {args.directory} on {args.host} without tokens "
            "(--tokens-file / --tokens-env); --allow-unauthenticated to do it anyway",
            highlight=False,
        )
        return 2
    warn_if_open(gate, "artifact server", args.host, args.port)

    running = server

    def reload() -> ServerTLSSettings | None:
        # What a live server cannot take on is refused before anything applies.
        nonlocal running
        fresh = load(args.config, **overrides).artifact_server
        if running.auth.enabled and not fresh.auth.enabled:
            raise ConfigError("reload refused: it removes every token; restart to serve open")
        refusal = client_ca_change(running.tls, fresh.tls)
        if refusal is not None:
            raise ConfigError(f"reload refused: {refusal}")
        gate.update(fresh.auth)
        running = fresh
        return fresh.tls

    app = create_app(args.directory, gate)
    # The services' defaults for slow clients, heads and connections (docs/security.md).
    limits = ServerSettings().connection_limits()
    run_service(
        app, host=args.host, port=args.port, limits=limits, tls=server.tls, on_reload=reload
    )
    return 0


def _node_policy(args: argparse.Namespace, err: Console) -> int:
    from model_sync.consul_policy import render_node_policy

    try:
        sys.stdout.write(render_node_policy(args.node_id, args.consul_node))
    except InvalidName as exc:
        err.print(f"[red]error:[/] {exc}", highlight=False)
        return 2
    return 0


def _keygen(args: argparse.Namespace, console: Console, err: Console) -> int:
    from model_sync.signing import generate_keypair

    try:
        private, public = generate_keypair(args.out, args.name)
    except (OSError, InvalidName) as exc:
        err.print(f"[red]error:[/] {exc}", highlight=False)
        return 1
    text = public.read_text(encoding="utf-8").strip()
    _out(
        console,
        args,
        {"private_key_file": str(private), "public_key_file": str(public), "public_key": text},
        f"private key: {private} (mode 0600; keep it off the nodes)\n"
        f"public key:  {public}\n"
        f"edges trust it with model_sync.trusted_keys: [{text}]",
    )
    return 0


def _whoami() -> str:
    try:
        return getpass.getuser()
    except (KeyError, OSError):
        return "unknown"


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    # Piped output is not cut to 80 columns: tables stay whole for grep and logs.
    console = Console(stderr=args.json, width=None if sys.stdout.isatty() else 160)
    err = Console(stderr=True)
    if args.command == "serve-artifacts":
        return _serve_artifacts(args, err)
    if args.command == "node-policy":
        return _node_policy(args, err)
    if args.command == "keygen":
        return _keygen(args, console, err)
    try:
        signing: dict[str, object] = {}
        if args.command in ("push", "sign"):  # no other command reads the key
            signing = {
                "signing.key_file": args.signing_key_file,
                "signing.key_env": args.signing_key_env,
            }
        cfg = load(args.config, args.registry_db, **signing)
        return asyncio.run(_run(args, cfg, console))
    except (ConfigError, StoreError, DownloadError, RegistryError, ValueError) as exc:
        err.print(f"[red]error:[/] {exc}", highlight=False)
        return 1
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
