"""Loading a service's settings tree from YAML, failing early and clearly.

An invalid file stops the service at start with the file's path and the
dotted field in the message, never a traceback from deep inside pydantic.
Every block of a settings tree is a :class:`Section`, so a misspelt key is
one of those errors rather than a setting silently left at its default.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any, TypeVar

import yaml
from pydantic import BaseModel, ConfigDict, ValidationError

__all__ = ["ConfigError", "Section", "apply_overrides", "deep_merge", "load_settings"]

_S = TypeVar("_S", bound=BaseModel)


class Section(BaseModel):
    """A block of a settings file: unknown keys are errors."""

    model_config = ConfigDict(extra="forbid")


class ConfigError(Exception):
    """A settings file is missing, unreadable, or invalid."""


def load_settings(
    model: type[_S],
    path: str | Path | None,
    environ: Mapping[str, str] | None = None,
    /,
    **overrides: Any,
) -> _S:
    """Read ``path`` (YAML) into ``model``; ``overrides`` are dotted keys set on top.

    ``None`` values in overrides are skipped, so CLI flags that were not given
    do not erase the file's values. ``environ`` (positional) replaces ``os.environ`` where
    secret settings name a variable (``token_env``; :mod:`servekit.secrets`).
    """
    data: dict[str, Any] = {}
    where = "<defaults>"
    if path is not None:
        where = str(path)
        try:
            text = Path(path).read_text(encoding="utf-8")
        except OSError as exc:
            raise ConfigError(f"{where}: cannot read settings file: {exc.strerror}") from None
        try:
            loaded = yaml.safe_load(text)
        except yaml.YAMLError as exc:
            raise ConfigError(f"{where}: not valid YAML: {exc}") from None
        if loaded is None:
            loaded = {}
        if not isinstance(loaded, dict):
            raise ConfigError(f"{where}: top level must be a mapping, got {type(loaded).__name__}")
        data = loaded
    data = apply_overrides(data, overrides)
    try:
        return model.model_validate(data, context={"environ": environ})
    except ValidationError as exc:
        lines = []
        for err in exc.errors(include_url=False):
            field = ".".join(str(p) for p in err["loc"]) or "<root>"
            lines.append(f"{where}: {field}: {err['msg']}")
        raise ConfigError("invalid settings\n  " + "\n  ".join(lines)) from None


def deep_merge(base: dict[str, Any], over: Mapping[str, Any]) -> dict[str, Any]:
    """A copy of ``base`` with ``over`` laid on top: mappings merged key by key,
    anything else (lists included) replaced whole."""
    out = dict(base)
    for key, value in over.items():
        if isinstance(value, Mapping) and isinstance(out.get(key), dict):
            out[key] = deep_merge(out[key], value)
        else:
            out[key] = value
    return out


def apply_overrides(data: dict[str, Any], overrides: dict[str, Any]) -> dict[str, Any]:
    """Return a copy of ``data`` with dotted-key ``overrides`` applied."""
    out: dict[str, Any] = {k: v for k, v in data.items()}
    for key, value in overrides.items():
        if value is None:
            continue
        node = out
        parts = key.split(".")
        for part in parts[:-1]:
            child = node.get(part)
            child = dict(child) if isinstance(child, dict) else {}
            node[part] = child
            node = child
        node[parts[-1]] = value
    return out
