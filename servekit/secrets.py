"""Secret settings: where their values come from, and keeping them out of sight.

A settings section that holds secrets derives from :class:`SecretSettings`
and names them in ``secret_fields``. Each such field ``x`` may then be given
in one of three ways, never two at once::

    token: "the value itself"           # in the YAML (fine for a laptop)
    token_file: /run/credentials/edge-agent.service/service-token
    token_env: EDGE_SERVICE_TOKEN       # the name of an environment variable

A file's content is read with surrounding whitespace stripped (the trailing
newline ``echo`` leaves); for a list field every non-empty line is one value
(an environment variable: separated by commas or whitespace; lines starting
with ``#`` are comments). Every ``*_file`` path of such a section (a token
file, a certificate, a key, a CA bundle) may name environment variables:
``$CREDENTIALS_DIRECTORY/service-token`` is how systemd's ``LoadCredential=``
hands files to a service. The values
are resolved when the settings load, so a missing file or variable fails at
start, naming the field; ``load_settings(model, path, environ)`` replaces
``os.environ`` for the lookups.

The second half keeps secrets out of status pages, logs and errors:
:func:`redact_env` / :func:`redact_argv` for command lines,
:func:`redact_url` / :func:`strip_url_credentials` for URLs (``user:password@``
and query tokens such as ``?token=`` or ``X-Amz-Signature``), and
:class:`RedactingFilter`, which ``servekit.serve`` puts on every service's log
handlers.
"""

from __future__ import annotations

import logging
import os
import re
import typing
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any, ClassVar
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

from pydantic import BaseModel, ConfigDict, ValidationInfo, model_validator

__all__ = [
    "REDACTED",
    "RedactingFilter",
    "SecretSettings",
    "is_secret_name",
    "redact_argv",
    "redact_env",
    "redact_text",
    "redact_url",
    "resolve_secret_sources",
    "strip_url_credentials",
]

REDACTED = "***"

# Names of environment variables, flags and query parameters that carry secrets:
# HF_TOKEN, NGC_API_KEY, AWS_SECRET_ACCESS_KEY, VLLM_API_KEY, LICENSE_KEY,
# --api-key, ?access_token=, X-Amz-Signature, X-Amz-Credential, sig= (SAS), key=,
# but not --max-num-batched-tokens or --tokenizer.
_SECRET_NAME = re.compile(
    r"secret|passw|credential|licen[cs]e|signature|cookie|authorization|token$"
    r"|(^|[_.-])(token|auth|sig|session|key)($|[_.-])"
    r"|(api|access|private)[_-]?key($|[_.-])",
    re.IGNORECASE,
)
_ENV_REF = re.compile(r"\$(\w+)|\$\{(\w+)\}")


def is_secret_name(name: str) -> bool:
    """Whether a variable, flag or parameter of this name should never be shown."""
    return bool(_SECRET_NAME.search(name.lstrip("-")))


# -- where secret values come from ----------------------------------------------


def _expand(path: str, environ: Mapping[str, str], field: str) -> str:
    def one(match: re.Match[str]) -> str:
        name = match.group(1) or match.group(2)
        if name not in environ:
            raise ValueError(f"{field}: ${name} is not set (in {path!r})")
        return environ[name]

    return _ENV_REF.sub(one, path)


def _is_list(annotation: Any) -> bool:
    if typing.get_origin(annotation) is list:
        return True
    return any(_is_list(a) for a in typing.get_args(annotation) if a is not type(None))


def resolve_secret_sources(
    data: Mapping[str, Any],
    fields: Mapping[str, bool],
    environ: Mapping[str, str] | None = None,
) -> dict[str, Any]:
    """``data`` with every ``<field>_file`` / ``<field>_env`` replaced by ``<field>``.

    ``fields`` maps each secret field's name to whether it is a list.
    """
    env = os.environ if environ is None else environ
    out = dict(data)
    for key, value in data.items():
        if key.endswith("_file") and isinstance(value, str):
            out[key] = _expand(value, env, key)
    for name, is_list in fields.items():
        file_key, env_key = f"{name}_file", f"{name}_env"
        given = [k for k in (name, file_key, env_key) if out.get(k) is not None]
        if len(given) > 1:
            raise ValueError(f"give only one of {', '.join(given)}")
        raw: str | None = None
        source = ""
        if out.get(file_key) is not None:
            source = file_key
            path = Path(str(out.pop(file_key)))
            try:
                raw = path.read_text(encoding="utf-8")
            except OSError as exc:
                raise ValueError(f"{file_key}: cannot read {path}: {exc.strerror}") from None
        elif out.get(env_key) is not None:
            source = env_key
            var = str(out.pop(env_key))
            if var not in env:
                raise ValueError(f"{env_key}: environment variable {var} is not set")
            raw = env[var]
        out.pop(file_key, None)
        out.pop(env_key, None)
        if raw is None:
            continue
        if is_list:
            splitter = r"\r?\n" if source == file_key else r"[\s,]+"
            lines = (v.strip() for v in re.split(splitter, raw))
            out[name] = [v for v in lines if v and not v.startswith("#")]
            if not out[name]:
                raise ValueError(f"{source}: no {name} in it")
        else:
            value = raw.strip()
            if not value:
                raise ValueError(f"{source}: it is empty")
            out[name] = value
    return out


class SecretSettings(BaseModel):
    """A settings section whose ``secret_fields`` also accept ``*_file`` and ``*_env``."""

    model_config = ConfigDict(extra="forbid")
    secret_fields: ClassVar[tuple[str, ...]] = ()

    @model_validator(mode="before")
    @classmethod
    def _secret_sources(cls, data: Any, info: ValidationInfo) -> Any:
        if not isinstance(data, Mapping):
            return data
        context = info.context if isinstance(info.context, Mapping) else {}
        environ = context.get("environ")
        fields = {n: _is_list(cls.model_fields[n].annotation) for n in cls.secret_fields}
        return resolve_secret_sources(data, fields, environ)


# -- keeping secrets out of sight -------------------------------------------------


def redact_env(env: Mapping[str, str]) -> dict[str, str]:
    """``env`` with the values of secret-looking names replaced by ``***``."""
    return {k: REDACTED if is_secret_name(k) else redact_text(v) for k, v in env.items()}


def redact_argv(argv: Iterable[str]) -> list[str]:
    """A command line with secret flags' values (``--api-key X``, ``--token=X``) hidden."""
    out: list[str] = []
    hide_next = False
    for arg in argv:
        if hide_next:
            out.append(REDACTED)
            hide_next = False
            continue
        if arg.startswith("-"):
            flag, eq, _ = arg.partition("=")
            if is_secret_name(flag):
                if eq:
                    out.append(f"{flag}={REDACTED}")
                else:
                    out.append(arg)
                    hide_next = True
                continue
        out.append(redact_text(arg))
    return out


def _clean_query(query: str, replace: bool) -> str:
    pairs = parse_qsl(query, keep_blank_values=True)
    if not any(is_secret_name(k) for k, _ in pairs):
        return query
    kept = [(k, REDACTED if is_secret_name(k) else v) for k, v in pairs]
    if not replace:
        kept = [(k, v) for k, v in pairs if not is_secret_name(k)]
    return urlencode(kept, safe="*")


def redact_url(url: str) -> str:
    """``url`` for display: ``user:password@`` and secret query values become ``***``."""
    try:
        parts = urlsplit(url)
    except ValueError:
        return REDACTED
    netloc = parts.netloc
    if "@" in netloc:
        netloc = f"{REDACTED}@{netloc.rpartition('@')[2]}"
    query = _clean_query(parts.query, replace=True)
    if (netloc, query) == (parts.netloc, parts.query):
        return url
    return urlunsplit((parts.scheme, netloc, parts.path, query, parts.fragment))


def strip_url_credentials(url: str) -> str:
    """``url`` without its credentials: no ``user:password@``, no secret query parameters.

    What a version record stores; the nodes authenticate with their own settings.
    """
    parts = urlsplit(url)
    netloc = parts.netloc.rpartition("@")[2]
    query = _clean_query(parts.query, replace=False)
    return urlunsplit((parts.scheme, netloc, parts.path, query, parts.fragment))


_URL_USERINFO = re.compile(r"(\b[a-zA-Z][a-zA-Z0-9+.-]*://)[^/\s@]+@")
_QUERY_PARAM = re.compile(r"([?&;]([^=&\s]+)=)([^&\s#'\":;,)>]*)")
_BEARER = re.compile(r"(\b(?:bearer|basic)\s+)[A-Za-z0-9._~+/=-]+", re.IGNORECASE)


def redact_text(text: str) -> str:
    """Free text (a log line, an error) with URL credentials and bearer tokens hidden."""
    text = _URL_USERINFO.sub(rf"\1{REDACTED}@", text)
    text = _QUERY_PARAM.sub(
        lambda m: m.group(1) + REDACTED if is_secret_name(m.group(2)) else m.group(0), text
    )
    return _BEARER.sub(rf"\1{REDACTED}", text)


class RedactingFilter(logging.Filter):
    """Hides URL credentials and bearer tokens in every record a handler emits."""

    _formatter = logging.Formatter()

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        clean = redact_text(message)
        if clean != message:
            record.msg, record.args = clean, None
        if record.exc_info and not record.exc_text:
            record.exc_text = redact_text(self._formatter.formatException(record.exc_info))
        return True
