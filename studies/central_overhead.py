"""Gateway overhead: the same request sent straight to an engine double and
through ``central serve`` (subprocess) with two URL replicas over doubles.

    flock -x bench.lock .venv/bin/python -m studies.central_overhead [--requests 300] [--stream]
"""

from __future__ import annotations

import argparse
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx
import yaml

from hybrid_llm.local.engine_double import create_double
from hybrid_llm.local.servers import REPO, UvicornThread, free_port, wait_ready


def _latencies(url: str, n: int, body: dict[str, Any]) -> tuple[float, float, float]:
    """p50, p95, p99 of ``n`` requests (ms), after 20 warm-up ones."""
    lat = []
    with httpx.Client(timeout=10) as c:
        for _ in range(20):
            c.post(url + "/v1/chat/completions", json=body)
        for _ in range(n):
            t = time.perf_counter()
            r = c.post(url + "/v1/chat/completions", json=body)
            lat.append((time.perf_counter() - t) * 1000)
            if r.status_code != 200:
                raise RuntimeError(f"{url}: {r.status_code} {r.text}")
    lat.sort()
    return statistics.median(lat), lat[int(0.95 * len(lat))], lat[int(0.99 * len(lat)) - 1]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--requests", type=int, default=300, help="measured requests per path")
    p.add_argument("--stream", action="store_true", help="stream the answers (SSE)")
    args = p.parse_args()
    n = args.requests
    body = {
        "model": "big",
        "messages": [{"role": "system", "content": "sys"}, {"role": "user", "content": "hi"}],
        "max_tokens": 4,
        "stream": args.stream,
    }
    with (
        UvicornThread(create_double("big")) as a,
        UvicornThread(create_double("big")) as b,
        tempfile.TemporaryDirectory(prefix="central-overhead-") as tmp,
    ):
        cfg = {
            "model": "big",
            "replicas": [
                {"name": "r0", "kind": "url", "url": a.url, "load_source": "vllm", "capacity": 8},
                {"name": "r1", "kind": "url", "url": b.url, "load_source": "vllm", "capacity": 8},
            ],
            "supervision": {"log_dir": str(Path(tmp) / "logs")},
        }
        config = Path(tmp) / "central.yaml"
        config.write_text(yaml.safe_dump(cfg))
        port = free_port()
        gw = f"http://127.0.0.1:{port}"
        command = [sys.executable, "-m", "central", "serve", "--config", str(config)]
        proc = subprocess.Popen(
            [*command, "--port", str(port)],
            cwd=REPO,
            env=dict(os.environ, PYTHONPATH=str(REPO)),
        )
        try:
            wait_ready(gw, 30)
            time.sleep(1)
            d = _latencies(a.url, n, body)
            g = _latencies(gw, n, body)
        finally:
            proc.send_signal(signal.SIGTERM)
            proc.wait(20)
    print(f"direct to replica : p50 {d[0]:.2f} ms  p95 {d[1]:.2f} ms  p99 {d[2]:.2f} ms  (n={n})")
    print(f"through gateway   : p50 {g[0]:.2f} ms  p95 {g[1]:.2f} ms  p99 {g[2]:.2f} ms  (n={n})")
    print(f"gateway adds      : p50 {g[0] - d[0]:.2f} ms  p99 {g[2] - d[2]:.2f} ms")


if __name__ == "__main__":
    main()
