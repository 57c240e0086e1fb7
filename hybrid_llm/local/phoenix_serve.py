"""Run Arize Phoenix (``phoenix serve``) with every port it opens on ``PHOENIX_HOST``.

The local topology's trace store (``configs/local.yaml``, ``hybrid-llm up
--tracing``) runs this under Phoenix's own interpreter
(``.phoenix/bin/python -m hybrid_llm.local.phoenix_serve serve``), so it
imports nothing of the project's, only the standard library, gRPC and Phoenix.

Why a wrapper: Phoenix 20.26 binds its web app and OTLP/HTTP receiver to
``PHOENIX_HOST`` but its OTLP/gRPC receiver to ``[::]:PHOENIX_GRPC_PORT``,
every interface, whatever the host says (``phoenix/server/grpc_server.py``),
and it has no setting to turn that receiver off short of read-only mode. With
authentication off (Phoenix's default) that port would take spans from the
whole network. Here gRPC's server factory is wrapped so a wildcard address
becomes ``PHOENIX_HOST`` before Phoenix's own command line runs.
"""

from __future__ import annotations

import importlib
import os
import sys
from typing import Any

__all__ = ["main", "narrow"]

_WILDCARDS = ("[::]", "0.0.0.0", "")


def narrow(address: str, host: str) -> str:
    """``address`` (``HOST:PORT``) on ``host`` when its host is a wildcard."""
    bound, sep, port = address.rpartition(":")
    if sep and bound in _WILDCARDS:
        return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
    return address


def _loopback_grpc(host: str) -> None:
    aio: Any = importlib.import_module("grpc.aio")
    make = aio.server

    def server(*args: Any, **kwargs: Any) -> Any:
        srv = make(*args, **kwargs)
        insecure, secure = srv.add_insecure_port, srv.add_secure_port
        srv.add_insecure_port = lambda address: insecure(narrow(address, host))
        srv.add_secure_port = lambda address, creds: secure(narrow(address, host), creds)
        return srv

    aio.server = server


def main() -> None:
    host = os.environ.get("PHOENIX_HOST") or "127.0.0.1"
    os.environ["PHOENIX_HOST"] = host
    if host not in ("0.0.0.0", "::"):  # an operator who asked for every interface gets it
        _loopback_grpc(host)
    sys.argv = ["phoenix", *sys.argv[1:]]
    importlib.import_module("phoenix.server.main").main()


if __name__ == "__main__":
    main()
