"""``central serve --config FILE [--host H] [--port P] ...`` and ``central print-commands``.

The flags of ``serve`` come from the settings' ``server:`` and ``instance:``
blocks (``central serve --help`` lists them).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from typing import Any

from central.settings import CentralSettings, load
from servekit.serve_cli import Service, add_serve_command, run_command

__all__ = ["SERVICE", "main"]


def _create_app(settings: CentralSettings) -> Any:
    from central.app import create_app

    return create_app(settings)


SERVICE = Service(
    "central",
    CentralSettings,
    _create_app,
    # In-flight streams get as long as the replicas get to stop.
    graceful_s=lambda settings: settings.supervision.stop_timeout_s,
)


def _print_commands(args: argparse.Namespace) -> int:
    from central.commands import print_commands

    print_commands(load(args.config), sys.stdout)
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="central", description="The central gateway over vLLM / TensorRT-LLM replicas."
    )
    sub = parser.add_subparsers(dest="command", required=True)
    add_serve_command(sub, SERVICE, help="launch the replicas and serve the gateway")
    show = sub.add_parser(
        "print-commands", help="print each replica's command line and generated files"
    )
    show.add_argument("--config", required=True, help="YAML settings file")
    show.set_defaults(func=_print_commands)
    return run_command("central", parser, argv)
