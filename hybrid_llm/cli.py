"""``hybrid-llm``: the umbrella command.

Each subcommand lives in its own module and registers itself in
:data:`SUBCOMMANDS`; this module only parses arguments and dispatches. The
subpackages follow the three concerns: :mod:`hybrid_llm.local` runs the
system on one machine (``up``, ``down``, ``status``, ``netem``),
:mod:`hybrid_llm.bench` measures it (``bench``, ``profile``) and
:mod:`hybrid_llm.fleet` models the fleet (``simulate``, ``simcheck``).
``fetch-models`` is the serving code's own (:mod:`servekit.fetch_cli`).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Sequence

__all__ = ["SUBCOMMANDS", "main"]

Register = Callable[["argparse._SubParsersAction[argparse.ArgumentParser]"], None]


def _register_fetch(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    from servekit.fetch_cli import register

    register(sub)


def _register_simcheck(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    from hybrid_llm.fleet.simcheck.cli import register

    register(sub)


def _register_bench(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    from hybrid_llm.bench.cli import register

    register(sub)


def _register_netem(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    from hybrid_llm.local.netem import register

    register(sub)


def _register_simulate(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    from hybrid_llm.fleet.sim.cli import register

    register(sub)


def _register_up(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    from hybrid_llm.local.up import register

    register(sub)


def _register_profile(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    from hybrid_llm.bench.profile import register

    register(sub)


SUBCOMMANDS: list[Register] = [
    _register_up,
    _register_fetch,
    _register_bench,
    _register_netem,
    _register_simulate,
    _register_simcheck,
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
