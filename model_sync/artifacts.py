"""A small artifact server for fleets without an object store.

``GET /<relative path>`` serves a file below the root directory with
``Range`` support (Starlette's ``FileResponse`` answers single and multiple
ranges, ``206``/``416``), so edge nodes can resume interrupted downloads.
Paths are resolved and must stay inside the root: ``..``, absolute paths and
symlinks that point elsewhere are answered with 404, like a missing file,
and so is any path with a part that starts with a dot (a cloned model's
``.git/config`` can hold a hub token) and any path the token gate leaves
open (a root file named ``metrics`` would otherwise be served without one).
With service tokens configured (``artifact_server.auth``) every file needs
``Authorization: Bearer <token>``; ``/health`` and ``/ready`` stay open.
"""

from __future__ import annotations

from pathlib import Path

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import FileResponse, PlainTextResponse, Response
from starlette.routing import Route
from starlette.types import ASGIApp

from servekit.service_auth import ServiceAuth, TokenGate

__all__ = ["create_app", "resolve_artifact"]


def resolve_artifact(root: Path, relative: str) -> Path | None:
    """The file ``relative`` names inside ``root``, or ``None`` if missing or outside it."""
    root = root.resolve()
    parts = [p for p in relative.split("/") if p]
    if not parts or any(p.startswith(".") or "\\" in p or "\x00" in p for p in parts):
        return None
    candidate = root.joinpath(*parts).resolve()
    if root not in candidate.parents or not candidate.is_file():
        return None
    return candidate


def create_app(root: Path, auth: TokenGate | None = None) -> ASGIApp:
    """Serve the files below ``root`` (read-only) to callers ``auth`` admits."""
    root = Path(root)
    gate = auth or TokenGate()

    async def health(request: Request) -> Response:
        return PlainTextResponse("ok")

    async def artifact(request: Request) -> Response:
        relative = request.path_params["path"]
        # A path the gate lets through without a token never names a file.
        hidden = gate.enabled and gate.is_open("/" + relative)
        path = None if hidden else resolve_artifact(root, relative)
        if path is None:
            return PlainTextResponse("not found", status_code=404)
        return FileResponse(path, filename=path.name, content_disposition_type="attachment")

    app = Starlette(
        routes=[
            Route("/health", health, methods=["GET"]),
            Route("/ready", health, methods=["GET"]),
            Route("/{path:path}", artifact, methods=["GET", "HEAD"]),
        ]
    )
    return ServiceAuth(app, gate)
