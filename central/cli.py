"""``central serve --config FILE [--host H] [--port P]`` and ``central print-commands``."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from servekit.config import ConfigError

__all__ = ["main"]


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="central", description="The central gateway over vLLM / TensorRT-LLM replicas."
    )
    sub = parser.add_subparsers(dest="command", required=True)
    serve = sub.add_parser("serve", help="launch the replicas and serve the gateway")
    serve.add_argument("--config", required=True, help="YAML settings file")
    serve.add_argument("--host", help="override server.host")
    serve.add_argument("--port", type=int, help="override server.port")
    show = sub.add_parser(
        "print-commands", help="print each replica's command line and generated files"
    )
    show.add_argument("--config", required=True, help="YAML settings file")
    args = parser.parse_args(argv)

    from central.settings import load

    try:
        settings = load(args.config, **{"server.host": getattr(args, "host", None),
                                        "server.port": getattr(args, "port", None)})  # fmt: skip
    except ConfigError as exc:
        print(f"central: {exc}", file=sys.stderr)
        return 2
    if args.command == "print-commands":
        from central.commands import print_commands

        print_commands(settings, sys.stdout)
        return 0

    from central.app import create_app
    from servekit.serve import run_service
    from servekit.tls import ServerTLSSettings

    app = create_app(settings)

    def reload() -> ServerTLSSettings | None:
        """SIGHUP: the service tokens and certificates of the file as it is now."""
        fresh = load(args.config, **{"server.host": args.host, "server.port": args.port})
        app.state.token_gate.update(fresh.server.auth)
        return fresh.server.tls

    def drain() -> None:
        gateway = getattr(app.state, "gateway", None)
        if gateway is not None:
            gateway.drain()

    run_service(
        app,
        host=settings.server.host,
        port=settings.server.port,
        on_drain=drain,
        graceful_s=settings.supervision.stop_timeout_s,
        tls=settings.server.tls,
        on_reload=reload,
    )
    return 0
