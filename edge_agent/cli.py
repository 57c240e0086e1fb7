"""``edge-agent serve --config FILE [--host H] [--port P]``."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from servekit.config import ConfigError, load_settings

__all__ = ["main"]


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="edge-agent", description="Serve a GGUF model at the edge."
    )
    sub = parser.add_subparsers(dest="command", required=True)
    serve = sub.add_parser("serve", help="run the agent")
    serve.add_argument("--config", required=True, help="YAML settings file")
    serve.add_argument("--host", help="override server.host")
    serve.add_argument("--port", type=int, help="override server.port")
    serve.add_argument("--region", help="override instance.region")
    serve.add_argument("--id", dest="instance_id", help="override instance.id")
    args = parser.parse_args(argv)

    from edge_agent.app import create_app
    from edge_agent.settings import EdgeSettings
    from servekit.serve import run_service
    from servekit.tls import ServerTLSSettings

    overrides = {
        "server.host": args.host,
        "server.port": args.port,
        "instance.region": args.region,
        "instance.id": args.instance_id,
    }
    try:
        settings = load_settings(EdgeSettings, args.config, **overrides)
    except ConfigError as exc:
        print(f"edge-agent: {exc}", file=sys.stderr)
        return 2
    app = create_app(settings)

    def reload() -> ServerTLSSettings | None:
        """SIGHUP: the service tokens and certificates of the file as it is now."""
        fresh = load_settings(EdgeSettings, args.config, **overrides)
        app.state.token_gate.update(fresh.server.auth)
        return fresh.server.tls

    def drain() -> None:
        agent = getattr(app.state, "agent", None)
        if agent is not None:
            agent.drain()

    run_service(
        app,
        host=settings.server.host,
        port=settings.server.port,
        on_drain=drain,
        log_level=settings.server.log_level,
        graceful_s=settings.server.graceful_shutdown_s,
        tls=settings.server.tls,
        on_reload=reload,
    )
    return 0
