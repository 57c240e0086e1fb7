"""The services stand apart from the tools: they install and import without them.

Tools (``hybrid_llm``'s bench, simulator, plots, local topology and test
doubles; ``studies``; ``tests``) and their dependencies (matplotlib, numpy)
come with the ``tools`` extra. A service node installs the runtime
dependencies (plus ``edge`` for llama.cpp), so no service module may import
any of them. Each check runs in a fresh interpreter in which importing a
blocked package fails the way it would where it is not installed.
"""

from __future__ import annotations

import ast
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
SERVICES = ("servekit", "geo_router", "edge_agent", "central", "model_sync")
TOOLS = ("hybrid_llm", "studies", "tests", "matplotlib", "numpy")
# What the `edge` extra adds: only the in-process llama.cpp engines load it.
LLAMA = ("llama_cpp",)
LLAMA_MODULES = (
    "servekit.engine.llama_lib",
    "servekit.engine.llama_vocab",
    "servekit.engine.batching",
    "servekit.engine.batching_llama",
    "servekit.engine.batching_sampler",
    "servekit.engine.batching_jobs",
    "servekit.engine.batching_sched",
    "servekit.engine.batching_step",
    "servekit.engine.batching_waiting",
)
ENTRY_POINTS = (
    "geo_router.cli", "geo_router.app", "edge_agent.cli", "edge_agent.app",
    "central.cli", "central.app", "model_sync.cli", "servekit.fetch_cli",
)  # fmt: skip

_BLOCKER = """
import importlib.abc, sys
BLOCKED = {blocked!r}
class Blocker(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in BLOCKED:
            raise ModuleNotFoundError(f"No module named {{name!r}} (blocked)", name=name)
        return None
sys.meta_path.insert(0, Blocker())
for name in BLOCKED:
    for loaded in [m for m in sys.modules if m.split(".")[0] == name]:
        del sys.modules[loaded]
"""


def _import_with_blocked(blocked: tuple[str, ...], modules: list[str]) -> None:
    code = _BLOCKER.format(blocked=set(blocked)) + "\n".join(f"import {m}" for m in modules)
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, check=False
    )
    assert done.returncode == 0, done.stderr[-2000:]


def _service_modules() -> list[str]:
    found = []
    for package in SERVICES:
        for path in sorted((REPO / package).rglob("*.py")):
            parts = path.relative_to(REPO).with_suffix("").parts
            if parts[-1] == "__main__":
                continue
            name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
            if name not in LLAMA_MODULES:
                found.append(name)
    return found


def test_the_blocker_blocks() -> None:
    """The check can fail: a tool module imported with tools blocked does."""
    with pytest.raises(AssertionError, match="blocked"):
        _import_with_blocked(TOOLS, ["hybrid_llm.bench.plot"])


def test_every_service_module_imports_without_the_tools() -> None:
    _import_with_blocked(TOOLS, _service_modules())


def test_no_service_module_imports_a_tool_even_lazily() -> None:
    """Imports inside functions too: they fail only when that path runs."""
    found = []
    for name in [*_service_modules(), *LLAMA_MODULES]:
        path = REPO / (name.replace(".", "/") + ".py")
        if not path.exists():
            path = REPO / name.replace(".", "/") / "__init__.py"
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                roots = [alias.name.split(".")[0] for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
                roots = [node.module.split(".")[0]]
            else:
                continue
            # numpy comes with llama-cpp-python (the `edge` extra) to the engines using it.
            allowed = {"numpy"} if name in LLAMA_MODULES else set()
            found += [f"{name}: {root}" for root in roots if root in set(TOOLS) - allowed]
    assert found == []


def test_the_services_start_without_llama_cpp() -> None:
    """A router, a vLLM edge or a gateway never loads llama.cpp."""
    _import_with_blocked(TOOLS + LLAMA, list(ENTRY_POINTS))


def test_the_runtime_dependencies_leave_the_tools_out() -> None:
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    runtime = " ".join(project["dependencies"]).lower()
    for tool_dependency in project["optional-dependencies"]["tools"]:
        name = tool_dependency.split(">")[0].split("=")[0].strip().lower()
        assert name not in runtime, f"{name} is a runtime dependency of every service"
