"""The engines' OpenMP spin setting reaches libgomp: set before llama_cpp loads."""

from __future__ import annotations

import os
import subprocess
import sys


def _spincount_in_fresh_process(env: dict[str, str]) -> str:
    code = (
        "import os, edge_agent.cli, servekit.engine.llama_vocab, llama_cpp;"
        "print(os.environ.get('GOMP_SPINCOUNT'))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True
    )
    return out.stdout.strip()


def test_engines_shorten_openmp_spinning_before_llama_cpp_loads() -> None:
    env = {k: v for k, v in os.environ.items() if k != "GOMP_SPINCOUNT"}
    assert _spincount_in_fresh_process(env) == "10000"


def test_an_operators_setting_wins() -> None:
    env = {**os.environ, "GOMP_SPINCOUNT": "123"}
    assert _spincount_in_fresh_process(env) == "123"
