"""The environment an engine process gets: an allowlist, never the service's own.

A service's environment holds what an engine has no business reading:
registry tokens (``CONSUL_HTTP_TOKEN``), ``$CREDENTIALS_DIRECTORY``, cloud
keys, the hub token. A launched engine (``vllm serve``, ``trtllm-serve``, a
stand-in replica) gets only the variables below from its parent, minus any
whose name says it is a secret (:func:`servekit.secrets.is_secret_name`,
so ``HF_TOKEN`` stays behind even though ``HF_*`` passes), plus what its
command sets: the launcher's own (``CUDA_VISIBLE_DEVICES``, ``VLLM_*`` cache
and CPU settings, the replica's key) and the config's ``env:`` block. A
model that needs a hub token gets it by name (``process.pass_env: [HF_TOKEN]``,
``supervision.pass_env`` on the gateway), so the secret stays out of the YAML.
"""

from __future__ import annotations

import os
from collections.abc import Collection, Mapping

from servekit.secrets import is_secret_name

__all__ = ["INHERITED_NAMES", "INHERITED_PREFIXES", "engine_environ"]

# Process basics; PYTHONPATH and VIRTUAL_ENV so a Python engine imports what we do;
# LD_LIBRARY_PATH and XDG_CACHE_HOME for CUDA libraries and the hub cache.
INHERITED_NAMES = frozenset(
    {
        "PATH", "HOME", "USER", "LOGNAME", "SHELL", "LANG", "LANGUAGE", "TZ",
        "TMPDIR", "TMP", "TEMP", "PYTHONPATH", "VIRTUAL_ENV", "LD_LIBRARY_PATH",
        "XDG_CACHE_HOME",
    }
)  # fmt: skip
# Locale, the engines' own knobs, OpenMP/MKL threading, GPUs, the (offline) hub cache,
# and OpenTelemetry's exporter settings (a collector's CA bundle, batch sizes) for an
# engine that exports its own spans; the launcher sets the endpoint and service name.
# OTEL_EXPORTER_OTLP_*HEADERS often holds a collector's API key: it passes only by name.
INHERITED_PREFIXES = (
    "LC_", "VLLM_", "OMP_", "GOMP_", "KMP_", "MKL_", "CUDA_", "NVIDIA_", "NCCL_",
    "PYTORCH_", "TORCHINDUCTOR_", "TRITON_", "TRTLLM_", "TLLM_", "HF_", "TRANSFORMERS_",
    "OTEL_",
)  # fmt: skip


def engine_environ(
    added: Mapping[str, str],
    passed: Collection[str] = (),
    parent: Mapping[str, str] | None = None,
) -> dict[str, str]:
    """The environment of an engine process: the allowed part of ``parent``
    (default ``os.environ``), the variables the config names in ``passed``
    (``process.pass_env``: a secret the service holds, e.g. ``HF_TOKEN``, given
    on purpose), then ``added`` (the command's, which wins)."""
    source = os.environ if parent is None else parent
    env = {
        name: value
        for name, value in source.items()
        if (name in INHERITED_NAMES or name.startswith(INHERITED_PREFIXES))
        and not is_secret_name(name)
        and not (name.startswith("OTEL_") and name.endswith("HEADERS"))
    }
    env.update((name, source[name]) for name in passed if name in source)
    env.update(added)
    return env
