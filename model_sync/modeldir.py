"""The versioned model directory on an edge node: ``<root>/<name>/<version>/<file>``.

Every path is built from checked names (:func:`model_sync.keys.check_name`)
and then verified to resolve inside the root, so neither a crafted record nor
a symlink planted in the tree can point a write or a delete outside it.
Partial downloads live in ``<root>/.partial/`` on the same filesystem, so
the final move is an atomic rename.
"""

from __future__ import annotations

import shutil
from pathlib import Path

from model_sync.keys import InvalidName, check_name

__all__ = ["ModelDir", "UnsafePath", "within"]


class UnsafePath(InvalidName):
    """A path that would leave the model directory."""


def within(base: Path, path: Path) -> Path:
    """``path`` resolved, if it stays inside ``base`` (links followed); else :class:`UnsafePath`."""
    base, resolved = base.resolve(), path.resolve()
    if resolved != base and base not in resolved.parents:
        raise UnsafePath(f"{path} resolves outside {base}")
    return resolved


class ModelDir:
    def __init__(self, root: Path) -> None:
        self.root = Path(root).resolve()

    def _inside(self, path: Path) -> Path:
        return self.inside(self.root, path)

    def inside(self, base: Path, path: Path) -> Path:
        """``path`` resolved, if it stays inside ``base`` (itself inside the root)."""
        return within(within(self.root, base), path)

    def model_dir(self, name: str) -> Path:
        return self._inside(self.root / check_name("model name", name))

    def version_dir(self, name: str, version: str) -> Path:
        return self._inside(self.model_dir(name) / check_name("version", version))

    def file_path(self, name: str, version: str, filename: str) -> Path:
        return self._inside(self.version_dir(name, version) / check_name("file name", filename))

    def partial_path(self, name: str, version: str, filename: str) -> Path:
        part = f"{check_name('model name', name)}--{check_name('version', version)}--"
        part += check_name("file name", filename) + ".part"
        return self._inside(self.root / ".partial" / part)

    def installed(self, name: str) -> list[str]:
        """Versions with a directory on disk, oldest first (by modification time)."""
        base = self.model_dir(name)
        if not base.is_dir():
            return []
        dirs = [p for p in base.iterdir() if p.is_dir() and not p.is_symlink()]
        return [p.name for p in sorted(dirs, key=lambda p: p.stat().st_mtime)]

    def gc(self, name: str, keep: set[str]) -> list[str]:
        """Delete every installed version of ``name`` not in ``keep``; returns what went."""
        removed = []
        for version in self.installed(name):
            if version in keep:
                continue
            try:
                target = self.version_dir(name, version)
            except InvalidName:
                continue  # not ours: a directory we would never have created
            shutil.rmtree(target)
            removed.append(version)
        return removed
