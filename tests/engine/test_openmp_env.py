"""The engines' OpenMP spin setting reaches libgomp, and only processes that load llama.cpp.

It is set right before ``llama_cpp`` is imported (``servekit.engine.llama_lib``),
not when a service package is imported: the router and a gateway over HTTP
replicas never load llama.cpp and keep the environment they were given.
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

_SERVICES = "geo_router.app, geo_router.cli, edge_agent.app, central.app, servekit.engine"


def _spincount_in_fresh_process(env: dict[str, str], imports: str) -> str:
    code = f"import os, {imports}; print(os.environ.get('GOMP_SPINCOUNT'))"
    out = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True
    )
    return out.stdout.strip()


def _clean_env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if k != "GOMP_SPINCOUNT"}


def test_importing_the_services_sets_nothing() -> None:
    assert _spincount_in_fresh_process(_clean_env(), _SERVICES) == "None"


def test_engines_shorten_openmp_spinning_before_llama_cpp_loads() -> None:
    pytest.importorskip("llama_cpp")
    imports = "edge_agent.cli, servekit.engine.llama_vocab, llama_cpp"
    assert _spincount_in_fresh_process(_clean_env(), imports) == "10000"


def test_an_operators_setting_wins() -> None:
    pytest.importorskip("llama_cpp")
    env = {**os.environ, "GOMP_SPINCOUNT": "123"}
    assert _spincount_in_fresh_process(env, "servekit.engine.llama_lib") == "123"
