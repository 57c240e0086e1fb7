"""The one ``serve`` command of every service, its flags generated from the settings model.

A service describes itself once as a :class:`Service` (its settings model and
how to build its app); :func:`add_serve_command` gives its CLI a ``serve``
subcommand with ``--config`` and one flag per plain field of the settings'
``server:`` and ``instance:`` blocks (``--port`` sets ``server.port``,
``--region`` sets ``instance.region``; help from the field's description).

The app :func:`serve` runs is built by the service's ``create_app`` and
carries :class:`ServiceHooks` on ``app.state.hooks``: what draining means
for it (called on SIGTERM before connections close) and what a reload
applies live. On SIGHUP the settings file is read again with the same flags
and handed to ``reload`` (API keys, service tokens), and the certificates it
names are loaded into the listening socket (:mod:`servekit.serve`). What is
fixed at start (its address, the connection limits: :data:`RESTART_ONLY`)
keeps its running value, with a warning naming what changed.

Fail closed: a service that would take unauthenticated calls on a
non-loopback address does not start unless ``server.allow_unauthenticated``
is set (:func:`servekit.service_auth.refuse_open_bind`). A reload that would
open the service (its authentication removed) or change client-certificate
checking (which a live socket cannot take on or drop) is refused: it is
logged as an error and the running settings stay.
"""

from __future__ import annotations

import argparse
import logging
import sys
import types
import typing
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Generic, Protocol, TypeVar, cast

from pydantic import BaseModel

from servekit.config import ConfigError, load_settings
from servekit.metrics import GuardMetrics
from servekit.service_auth import refuse_open_bind
from servekit.settings import ServerSettings
from servekit.tls import ServerTLSSettings, client_ca_change

__all__ = [
    "FLAG_BLOCKS",
    "RESTART_ONLY",
    "Service",
    "ServiceHooks",
    "ServiceSettings",
    "add_serve_command",
    "refuse_open",
    "reload_refusal",
    "restart_only_changes",
    "run_command",
    "serve",
    "serve_overrides",
]

# The blocks whose plain fields become flags of ``serve``.
FLAG_BLOCKS = ("server", "instance")

# ``server:`` fields fixed when the service starts (most with its socket): a reload
# cannot change them.
RESTART_ONLY = (
    "host",
    "port",
    "send_stall_s",
    "stream_deadline_s",
    "header_timeout_s",
    "max_header_bytes",
    "max_connections",
)

log = logging.getLogger(__name__)


class ServiceSettings(Protocol):
    """A service's settings tree: it has a ``server:`` block and says whether
    callers must authenticate (``open_because``: why not, or None)."""

    @property
    def server(self) -> ServerSettings: ...

    @property
    def open_because(self) -> str | None: ...


S = TypeVar("S", bound=ServiceSettings)


@dataclass
class ServiceHooks:
    """What the kit calls on a running service: ``drain`` (SIGTERM, before connections
    close) and ``reload`` (SIGHUP, with the settings file as it is now)."""

    drain: Callable[[], None]
    reload: Callable[[Any], None]


@dataclass(frozen=True)
class Service(Generic[S]):
    """One service as its CLI serves it."""

    name: str
    settings: type[S]
    create_app: Callable[[S], Any]
    config_required: bool = True
    graceful_s: Callable[[S], float] = lambda settings: settings.server.graceful_shutdown_s


def _flag_type(annotation: Any) -> tuple[Callable[[str], Any] | None, list[Any] | None]:
    """(argparse type, choices) for a plain field; (None, None) for anything else."""
    args = [a for a in typing.get_args(annotation) if a is not type(None)]
    origin = typing.get_origin(annotation)
    if origin is typing.Literal:
        return str, list(typing.get_args(annotation))
    if origin in (typing.Union, types.UnionType) and len(args) == 1:
        return _flag_type(args[0])
    if annotation in (str, int, float):
        return cast(Callable[[str], Any], annotation), None
    return None, None


def add_serve_command(
    sub: Any, service: Service[Any], help: str = "run the service"
) -> argparse.ArgumentParser:
    """Add ``serve`` to a CLI's subparsers: ``--config`` and the generated flags."""
    parser: argparse.ArgumentParser = sub.add_parser("serve", help=help)
    parser.add_argument(
        "--config", type=Path, required=service.config_required, help="YAML settings file"
    )
    for block in FLAG_BLOCKS:
        field = cast(type[BaseModel], service.settings).model_fields.get(block)
        model = field.annotation if field is not None else None
        if not (isinstance(model, type) and issubclass(model, BaseModel)):
            continue
        for name, spec in model.model_fields.items():
            kind, choices = _flag_type(spec.annotation)
            if kind is None:
                continue
            about = (spec.description or "").rstrip(".")
            parser.add_argument(
                "--" + name.replace("_", "-"),
                dest=f"{block}.{name}",
                type=kind,
                choices=choices,
                default=None,
                help=f"{about} (sets {block}.{name})",
            )
    parser.set_defaults(func=lambda args: serve(service, args))
    return parser


def serve_overrides(args: argparse.Namespace) -> dict[str, Any]:
    """The dotted settings keys the generated flags set (unset flags are None: skipped)."""
    return {key: value for key, value in vars(args).items() if "." in key}


def serve(service: Service[S], args: argparse.Namespace) -> int:
    """Load the settings, build the app, run it until a signal stops it."""
    from servekit.serve import run_service

    overrides = serve_overrides(args)

    def load() -> S:
        model = cast(type[BaseModel], service.settings)
        return cast(S, load_settings(model, args.config, **overrides))

    settings = load()
    refuse_open(settings)
    app = service.create_app(settings)
    hooks: ServiceHooks = app.state.hooks
    running = settings

    def reload() -> ServerTLSSettings | None:
        nonlocal running
        fresh = load()
        refusal = reload_refusal(running, fresh)
        if refusal is not None:
            raise ConfigError(f"reload refused: {refusal}")
        refuse_open(fresh)
        kept = restart_only_changes(running, fresh)
        if kept:
            log.warning(
                "reload: server.%s changed, which needs a restart; the running values stay",
                ", server.".join(kept),
            )
        hooks.reload(fresh)
        running = fresh
        return fresh.server.tls

    server = settings.server
    guard: GuardMetrics | None = getattr(app.state, "connection_guard", None)
    run_service(
        app,
        host=server.host,
        port=server.port,
        on_drain=hooks.drain,
        log_level=server.log_level,
        graceful_s=service.graceful_s(settings),
        limits=server.connection_limits(),
        on_close=guard.closed if guard is not None else None,
        tls=server.tls,
        on_reload=reload,
    )
    return 0


def refuse_open(settings: ServiceSettings) -> None:
    """:class:`ConfigError` if the service would listen open on a non-loopback address."""
    try:
        refuse_open_bind(
            settings.server.host,
            settings.open_because,
            settings.server.allow_unauthenticated,
        )
    except ValueError as exc:
        raise ConfigError(str(exc)) from None


def reload_refusal(running: ServiceSettings, fresh: ServiceSettings) -> str | None:
    """Why ``fresh`` cannot replace ``running`` on a live service (None: it can)."""
    if running.open_because is None and fresh.open_because is not None:
        return (
            f"it removes authentication ({fresh.open_because}), which would open the "
            "service to anyone; restart it to do that"
        )
    return client_ca_change(running.server.tls, fresh.server.tls)


def restart_only_changes(running: ServiceSettings, fresh: ServiceSettings) -> list[str]:
    """The :data:`RESTART_ONLY` fields of ``server:`` that ``fresh`` changes."""
    return [
        name
        for name in RESTART_ONLY
        if getattr(running.server, name) != getattr(fresh.server, name)
    ]


def run_command(prog: str, parser: argparse.ArgumentParser, argv: Sequence[str] | None) -> int:
    """Parse ``argv``, run the chosen subcommand; a bad settings file exits 2 with its message."""
    args = parser.parse_args(argv)
    try:
        code: int = args.func(args)
    except ConfigError as exc:
        print(f"{prog}: {exc}", file=sys.stderr)
        return 2
    return code
