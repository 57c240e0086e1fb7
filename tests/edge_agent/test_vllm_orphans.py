"""An edge agent that dies (SIGKILL) takes its own `vllm serve` with it, workers
included, and a restarted agent runs exactly one (issue 30)."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from hybrid_llm.local.proctree import descendants
from hybrid_llm.local.servers import free_port, service_process
from servekit.procfs import same_process, stat
from tests.support.vllm import require_vllm, vllm_engine, write_edge_config

pytestmark = [pytest.mark.vllm, pytest.mark.slow]


def _vllm_groups(agent: int) -> list[int]:
    """The agent's direct children: the lifeline watcher leading `vllm serve`'s group."""
    return [pid for pid, _ in descendants(agent) if (st := stat(pid)) and st.ppid == agent]


def test_a_killed_edge_agent_takes_its_vllm_serve_along(tmp_path: Path) -> None:
    require_vllm()
    port = free_port()
    config = write_edge_config(tmp_path / "edge.yaml", port, vllm_engine(tmp_path))
    args = ["edge_agent", "serve", "--config", str(config)]
    url = f"http://127.0.0.1:{port}"
    with service_process(args, url, ready_timeout=420) as agent:
        engines = descendants(agent.pid)
        assert len(_vllm_groups(agent.pid)) == 1
        assert len(engines) >= 2  # the watcher and `vllm serve` (and its engine core)
        agent.kill()
        agent.wait()
        started = time.monotonic()
        while any(same_process(*p) for p in engines) and time.monotonic() - started < 30:
            time.sleep(0.1)
        assert [p for p in engines if same_process(*p)] == []
        assert time.monotonic() - started < 15
    with service_process(args, url, ready_timeout=420) as again:
        assert len(_vllm_groups(again.pid)) == 1
