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
import getpass
import os
import sys
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path

from rich.console import Console

from model_sync import cli_nodes, cli_rollouts, cli_versions
from model_sync.download import DownloadError
from model_sync.plan import parse_duration
from model_sync.settings import ModelSyncSettings, load
from model_sync.store import StoreError, SyncStore
from servekit.config import ConfigError
from servekit.registry import Registry, RegistryError, open_registry

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


# The commands themselves live by concern: version records (cli_versions),
# rollouts and their controller (cli_rollouts), what the nodes are given (cli_nodes).
COMMANDS: dict[str, Command] = {
    "list": cli_versions.list_versions,
    "rollout": cli_rollouts.rollout,
    "status": cli_rollouts.status,
    "pause": cli_rollouts.steer,
    "resume": cli_rollouts.steer,
    "promote": cli_rollouts.steer,
    "abort": cli_rollouts.steer,
    "rollback": cli_rollouts.rollback,
    "history": cli_rollouts.history,
}


async def _run(args: argparse.Namespace, cfg: ModelSyncSettings, console: Console) -> int:
    registry = await open_registry(cfg.registry)
    try:
        store = SyncStore(registry, actor=args.actor or _whoami())
        if args.command == "controller":
            await cli_rollouts.controller(args, registry, store, console, cfg)
            return 0
        if args.command == "push":
            await cli_versions.push(args, registry, store, console, cfg)
            return 0
        if args.command == "sign":
            await cli_versions.sign(args, registry, store, console, cfg)
            return 0
        return await COMMANDS[args.command](args, registry, store, console) or 0
    finally:
        await registry.aclose()


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
        return cli_nodes.serve_artifacts(args, err)
    if args.command == "node-policy":
        return cli_nodes.node_policy(args, err)
    if args.command == "keygen":
        return cli_versions.keygen(args, console, err)
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
