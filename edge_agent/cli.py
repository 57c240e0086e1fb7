"""``edge-agent serve --config FILE [--host H] [--port P] [--region R] [--id I] ...``.

The flags come from the settings' ``server:`` and ``instance:`` blocks
(``edge-agent serve --help`` lists them).
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from typing import Any

from edge_agent.settings import EdgeSettings
from servekit.serve_cli import Service, add_serve_command, run_command

__all__ = ["SERVICE", "main"]


def _create_app(settings: EdgeSettings) -> Any:
    from edge_agent.app import create_app

    return create_app(settings)


SERVICE = Service("edge-agent", EdgeSettings, _create_app)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="edge-agent", description="Serve a GGUF model at the edge."
    )
    sub = parser.add_subparsers(dest="command", required=True)
    add_serve_command(sub, SERVICE, help="run the agent")
    return run_command("edge-agent", parser, argv)
