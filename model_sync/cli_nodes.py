"""``model-sync`` commands for what the edge nodes are given, neither of which
opens the registry: ``serve-artifacts`` serves the files they download, and
``node-policy`` prints one node's own Consul ACL policy."""

from __future__ import annotations

import argparse
import sys

from rich.console import Console

from model_sync.keys import InvalidName
from model_sync.settings import load
from servekit.config import ConfigError

__all__ = ["node_policy", "serve_artifacts"]


def serve_artifacts(args: argparse.Namespace, err: Console) -> int:
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


def node_policy(args: argparse.Namespace, err: Console) -> int:
    from model_sync.consul_policy import render_node_policy

    try:
        sys.stdout.write(render_node_policy(args.node_id, args.consul_node))
    except InvalidName as exc:
        err.print(f"[red]error:[/] {exc}", highlight=False)
        return 2
    return 0
