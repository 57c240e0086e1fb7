"""SIGKILL one CPU stand-in under steady traffic: time to leave rotation, time
to serve again, and request outcomes meanwhile."""

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import yaml

REPO = Path(__file__).resolve().parents[1]

sys.path.insert(0, str(REPO))
from tests.support.servers import free_port, wait_ready  # noqa: E402

cfg = yaml.safe_load((REPO / "configs" / "central-cpu.yaml").read_text())
cfg["supervision"]["log_dir"] = "/tmp/central-bench/cpu-logs"
cfg.pop("registry")
Path("/tmp/central-bench/cpu.yaml").write_text(yaml.safe_dump(cfg))
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
        "/tmp/central-bench/cpu.yaml",
        "--port",
        str(port),
    ],
    cwd=str(REPO),
    env=env,
    stderr=subprocess.DEVNULL,
)


def reps():
    return {r["name"]: r for r in httpx.get(gw + "/replicas").json()["replicas"]}


try:
    t0 = time.monotonic()
    wait_ready(gw, 120)
    while not all(r["state"] == "healthy" for r in reps().values()):
        time.sleep(0.05)
    print(f"gateway start to both replicas healthy: {time.monotonic() - t0:.2f} s")
    codes = []
    stop = False

    def traffic():
        i = 0
        with httpx.Client(timeout=60) as c:
            while not stop:
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

    ts = [threading.Thread(target=traffic) for _ in range(2)]
    for t in ts:
        t.start()
    time.sleep(2)
    victim = reps()["cpu-a"]
    n0 = len(codes)
    os.kill(victim["pid"], signal.SIGKILL)
    tk = time.monotonic()
    while reps()["cpu-a"]["state"] == "healthy":
        time.sleep(0.01)
    t_out = time.monotonic() - tk
    while not (reps()["cpu-a"]["state"] == "healthy" and reps()["cpu-a"]["restarts"] == 1):
        time.sleep(0.02)
    t_back = time.monotonic() - tk
    n_down = len(codes) - n0
    time.sleep(1)
    stop = True
    for t in ts:
        t.join()
    m = httpx.get(gw + "/metrics").text
    retries = [ln for ln in m.splitlines() if ln.startswith("central_dispatch_retries_total")]
    print(f"SIGKILL to out of rotation: {t_out * 1000:.0f} ms; to serving again: {t_back:.2f} s")
    print(
        f"requests while cpu-a was away: {n_down}; all requests: {len(codes)}, "
        f"non-200: {sum(c != 200 for c in codes)}"
    )
    print(retries[0] if retries else "no retries line")
finally:
    p.send_signal(signal.SIGTERM)
    p.wait(30)
