"""schemathesis, every check, against a real edge agent on the real model."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from hybrid_llm.local.servers import free_port, service_process

pytestmark = [pytest.mark.model, pytest.mark.slow, pytest.mark.timeout(1200)]


def test_schemathesis_all_checks_find_nothing(model_path: Any, tmp_path: Path) -> None:
    # A context roomy enough for fuzzed prompts: a prompt over the context is a
    # correct 400 that schemathesis would still count as a schema-valid rejection.
    # A fuzzed max_tokens may ask for the whole context (~2,000 tokens): on a busy
    # two-core machine that takes over a minute, so the timeouts leave room for it,
    # and one thread: llama.cpp's two threads wait on each other when another
    # process holds a core (measured: 2 tokens/s with two threads, 12 with one).
    port = free_port()
    cfg = tmp_path / "edge.yaml"
    cfg.write_text(
        f"""
server: {{host: 127.0.0.1, port: {port}, log_level: warning}}
instance: {{id: edge-st, region: test, version: v1}}
engine: {{model_path: {model_path}, model_name: smol, n_ctx: 2048, n_threads: 1,
          warmup_tokens: 1, default_max_tokens: 8}}
admission: {{max_waiting: 64}}
"""
    )
    url = f"http://127.0.0.1:{port}"
    st = shutil.which("schemathesis", path=str(Path(sys.executable).parent))
    assert st is not None
    with service_process(["edge_agent", "serve", "--config", str(cfg)], url):
        proc = subprocess.run(
            [
                st, "run", f"{url}/openapi.json", "--checks", "all", "--max-examples", "25",
                "--workers", "1", "--request-timeout", "300", "--max-response-time", "300",
                "--seed", "20261130",
            ],
            capture_output=True, text=True, timeout=900, check=False,
        )  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-6000:] + proc.stderr[-2000:]
    assert " passed" in proc.stdout
