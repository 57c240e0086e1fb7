"""``fetch-models``: fetch and verify the bundled models into a directory.

The serving code's own command line for :mod:`servekit.modelfetch`; the
umbrella ``hybrid-llm`` CLI mounts it as ``hybrid-llm fetch-models``
(``scripts/setup.sh`` runs it).
"""

from __future__ import annotations

import argparse
import functools
from pathlib import Path

from rich.progress import Progress, TaskID

__all__ = ["register"]


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
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
