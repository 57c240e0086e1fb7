"""Gateway overhead: the same request sent straight to an engine double and
through `central serve` (subprocess) with two URL replicas over doubles."""

import os
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path

import httpx
import yaml

REPO = Path(__file__).resolve().parents[1]

sys.path.insert(0, str(REPO))
from tests.central.engine_double import create_double  # noqa: E402
from tests.support.servers import UvicornThread, free_port, wait_ready  # noqa: E402

STREAM = os.environ.get("STREAM") == "1"
N = int(sys.argv[1]) if len(sys.argv) > 1 else 300
body = {
    "model": "big",
    "messages": [{"role": "system", "content": "sys"}, {"role": "user", "content": "hi"}],
    "max_tokens": 4,
    "stream": STREAM,
}


def run(url, n):
    lat = []
    with httpx.Client(timeout=10) as c:
        for _ in range(20):
            c.post(url + "/v1/chat/completions", json=body)
        for _ in range(n):
            t = time.perf_counter()
            r = c.post(url + "/v1/chat/completions", json=body)
            lat.append((time.perf_counter() - t) * 1000)
            assert r.status_code == 200, r.text
    lat.sort()
    return statistics.median(lat), lat[int(0.95 * len(lat))], lat[int(0.99 * len(lat)) - 1]


with UvicornThread(create_double("big")) as a, UvicornThread(create_double("big")) as b:
    cfg = {
        "model": "big",
        "replicas": [
            {"name": "r0", "kind": "url", "url": a.url, "load_source": "vllm", "capacity": 8},
            {"name": "r1", "kind": "url", "url": b.url, "load_source": "vllm", "capacity": 8},
        ],
        "supervision": {"log_dir": "/tmp/central-bench/logs"},
    }
    Path("/tmp/central-bench/cfg.yaml").write_text(yaml.safe_dump(cfg))
    port = free_port()
    gw = f"http://127.0.0.1:{port}"
    env = dict(os.environ, PYTHONPATH=str(REPO))
    p = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "central",
            "serve",
            "--config",
            "/tmp/central-bench/cfg.yaml",
            "--port",
            str(port),
        ],
        cwd=str(REPO),
        env=env,
    )
    try:
        wait_ready(gw, 30)
        time.sleep(1)
        d = run(a.url, N)
        g = run(gw, N)
        print(
            f"direct to replica : p50 {d[0]:.2f} ms  p95 {d[1]:.2f} ms  p99 {d[2]:.2f} ms  (n={N})"
        )
        print(
            f"through gateway   : p50 {g[0]:.2f} ms  p95 {g[1]:.2f} ms  p99 {g[2]:.2f} ms  (n={N})"
        )
        print(f"gateway adds      : p50 {g[0] - d[0]:.2f} ms  p99 {g[2] - d[2]:.2f} ms")
    finally:
        p.send_signal(signal.SIGTERM)
        p.wait(20)
