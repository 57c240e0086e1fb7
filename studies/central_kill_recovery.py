"""SIGKILL one CPU stand-in under steady traffic: time to leave rotation, time
to serve again, and request outcomes meanwhile.

    flock -x bench.lock .venv/bin/python -m studies.central_kill_recovery

Starts ``central serve`` on ``configs/central-cpu.yaml`` (two llama.cpp
replicas, no registry) in a subprocess; needs the bundled model.
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import httpx
import yaml

from hybrid_llm.local.servers import (
    REPO,
    all_replicas_healthy,
    free_port,
    gateway_replicas,
    wait_ready,
)


def _traffic(gw: str, codes: list[int], stop: threading.Event) -> None:
    i = 0
    with httpx.Client(timeout=60) as c:
        while not stop.is_set():
            r = c.post(
                gw + "/v1/chat/completions",
                json={
                    "model": "smollm2-135m-instruct",
                    "messages": [{"role": "user", "content": f"q{i}"}],
                    "max_tokens": 4,
                },
            )
            codes.append(r.status_code)
            i += 1
            if r.status_code != 200:
                print("FAILED", r.status_code, r.text[:300])


def measure(gw: str, victim_name: str) -> None:
    t0 = time.monotonic()
    wait_ready(gw, 120)
    while not all_replicas_healthy(gw):
        time.sleep(0.05)
    print(f"gateway start to both replicas healthy: {time.monotonic() - t0:.2f} s")
    codes: list[int] = []
    stop = threading.Event()
    threads = [threading.Thread(target=_traffic, args=(gw, codes, stop)) for _ in range(2)]
    for t in threads:
        t.start()
    try:
        time.sleep(2)
        victim = gateway_replicas(gw)[victim_name]
        n0 = len(codes)
        os.kill(victim["pid"], signal.SIGKILL)
        tk = time.monotonic()
        while gateway_replicas(gw)[victim_name]["state"] == "healthy":
            time.sleep(0.01)
        t_out = time.monotonic() - tk
        while True:
            back = gateway_replicas(gw)[victim_name]
            if back["state"] == "healthy" and back["restarts"] == 1:
                break
            time.sleep(0.02)
        t_back = time.monotonic() - tk
        n_down = len(codes) - n0
        time.sleep(1)
    finally:
        stop.set()
        for t in threads:
            t.join()
    m = httpx.get(gw + "/metrics").text
    retries = [ln for ln in m.splitlines() if ln.startswith("central_dispatch_retries_total")]
    print(f"SIGKILL to out of rotation: {t_out * 1000:.0f} ms; to serving again: {t_back:.2f} s")
    print(
        f"requests while {victim_name} was away: {n_down}; all requests: {len(codes)}, "
        f"non-200: {sum(c != 200 for c in codes)}"
    )
    print(retries[0] if retries else "no retries line")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--config", type=Path, default=REPO / "configs" / "central-cpu.yaml")
    p.add_argument("--victim", default="cpu-a", help="replica to SIGKILL")
    args = p.parse_args()
    with tempfile.TemporaryDirectory(prefix="central-kill-") as tmp:
        cfg = yaml.safe_load(args.config.read_text())
        cfg["supervision"]["log_dir"] = str(Path(tmp) / "logs")
        cfg.pop("registry", None)
        config = Path(tmp) / "central.yaml"
        config.write_text(yaml.safe_dump(cfg))
        port = free_port()
        command = [sys.executable, "-m", "central", "serve", "--config", str(config)]
        proc = subprocess.Popen(
            [*command, "--port", str(port)],
            cwd=REPO,
            env=dict(os.environ, PYTHONPATH=str(REPO)),
            stderr=subprocess.DEVNULL,
        )
        try:
            measure(f"http://127.0.0.1:{port}", args.victim)
        finally:
            proc.send_signal(signal.SIGTERM)
            proc.wait(30)


if __name__ == "__main__":
    main()
