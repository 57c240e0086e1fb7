"""``hybrid-llm``: the umbrella command.

Each subcommand lives in its own module and registers itself in
:data:`SUBCOMMANDS`; this module only parses arguments and dispatches.
"""

from __future__ import annotations

import argparse
import functools
import sys
from collections.abc import Callable, Sequence
from pathlib import Path

from rich.progress import Progress, TaskID

__all__ = ["SUBCOMMANDS", "main"]

Register = Callable[["argparse._SubParsersAction[argparse.ArgumentParser]"], None]


def _register_fetch(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("fetch-models", help="fetch and verify the bundled GGUF models")
    p.add_argument("--dest", type=Path, default=Path("models"), help="target directory")
    p.add_argument(
        "--model", action="append", default=None, help="model name (default: all bundled)"
    )
    p.set_defaults(func=_fetch_models)


def _fetch_models(args: argparse.Namespace) -> int:
    from rich.console import Console
    from rich.progress import BarColumn, DownloadColumn, TransferSpeedColumn

    from servekit.modelfetch import BUNDLED_MODELS, FetchError, fetch_model

    console = Console(stderr=True)
    names = args.model or list(BUNDLED_MODELS)
    for name in names:
        model = BUNDLED_MODELS.get(name)
        if model is None:
            console.print(f"[red]unknown model {name!r}; known: {', '.join(BUNDLED_MODELS)}")
            return 2
        with Progress(
            "[progress.description]{task.description}",
            BarColumn(),
            DownloadColumn(),
            TransferSpeedColumn(),
            console=console,
            transient=True,
        ) as progress:
            task = progress.add_task(model.filename, total=model.size)
            try:
                path = fetch_model(
                    model,
                    args.dest,
                    progress=functools.partial(_advance, progress, task),
                    log=lambda msg: progress.console.print(msg),
                )
            except FetchError as exc:
                console.print(f"[red]fetch failed: {exc}")
                return 1
        console.print(f"{name}: {path}")
    return 0


def _advance(progress: Progress, task: TaskID, done: int, total: int) -> None:
    progress.update(task, completed=done, total=total)


def _register_bench(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    from hybrid_llm.bench.cli import register

    register(sub)


def _register_netem(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    from hybrid_llm.netem import register

    register(sub)


def _register_simulate(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    from hybrid_llm.sim.cli import register

    register(sub)


def _register_up(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    from hybrid_llm.up import register

    register(sub)


def _register_profile(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    from hybrid_llm.profile import register

    register(sub)


SUBCOMMANDS: list[Register] = [
    _register_up,
    _register_fetch,
    _register_bench,
    _register_netem,
    _register_simulate,
    _register_profile,
]


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="hybrid-llm", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    for register in SUBCOMMANDS:
        register(sub)
    args = parser.parse_args(argv)
    code: int = args.func(args)
    return code


if __name__ == "__main__":
    sys.exit(main())
