"""Router-added TTFT: the same fast fake upstream called directly and through the router.

    .venv/bin/python bench/router_overhead.py [--requests 300] [--concurrency 1 200]

Starts, as separate processes on loopback: a fast fake OpenAI upstream (raw
ASGI under uvicorn; first token at once, then ``max_tokens - 1`` more every
``bench_interval_ms``, so streams stay open and concurrency is real) and
``geo-router serve`` in front of it. For each concurrency level it keeps
that many streams open at once, first straight to the upstream and then
through the router, and prints TTFT p50/p99 of both and their difference
(the router-added latency), plus the router's own
``router_added_latency_seconds`` histogram. Targets: p50 <= 1 ms, p99 <= 5 ms.
One run, figures printed; nothing asserted.
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable, MutableMapping
from pathlib import Path
from typing import Any

import aiohttp
import httpx

REPO = Path(__file__).resolve().parents[1]
KEY = "sk-bench"

Scope = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[MutableMapping[str, Any]]]
Send = Callable[[MutableMapping[str, Any]], Awaitable[None]]


def _chunk(i: int, text: str | None, finish: str | None = None) -> bytes:
    delta = {"content": text} if text is not None else {}
    event = {
        "id": "chatcmpl-bench",
        "object": "chat.completion.chunk",
        "created": 1,
        "model": "bench",
        "choices": [{"index": 0, "delta": delta, "finish_reason": finish}],
    }
    return b"data: " + json.dumps(event).encode() + b"\n\n"


async def upstream_app(scope: Scope, receive: Receive, send: Send) -> None:
    """The fake upstream: /ready, /load, and a chat stream (first token at once)."""
    if scope["type"] == "lifespan":
        while True:
            message = await receive()
            if message["type"] == "lifespan.startup":
                await send({"type": "lifespan.startup.complete"})
            else:
                await send({"type": "lifespan.shutdown.complete"})
                return
    path = scope["path"]
    if path in ("/ready", "/load"):
        body = json.dumps({"ready": True, "capacity": 100000, "model": "bench"}).encode()
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": body})
        return
    raw = b""
    more = True
    while more:
        message = await receive()
        raw += message.get("body", b"")
        more = message.get("more_body", False)
    body = json.loads(raw)
    tokens, interval_s = body.get("max_tokens", 4), body.get("bench_interval_ms", 5) / 1000
    headers = [(b"content-type", b"text/event-stream")]
    await send({"type": "http.response.start", "status": 200, "headers": headers})
    await send({"type": "http.response.body", "body": _chunk(0, "Hello"), "more_body": True})
    for i in range(1, tokens):
        await asyncio.sleep(interval_s)
        await send({"type": "http.response.body", "body": _chunk(i, " tok"), "more_body": True})
    tail = _chunk(9, None, "stop") + b"data: [DONE]\n\n"
    await send({"type": "http.response.body", "body": tail})


def request_body(tokens: int, interval_ms: float) -> bytes:
    """A chat request; the fake upstream streams ``tokens`` chunks ``interval_ms`` apart."""
    messages = [{"role": "user", "content": "hi"}]
    body = {"model": "bench", "stream": True, "messages": messages, "max_tokens": tokens}
    body["bench_interval_ms"] = interval_ms
    return json.dumps(body).encode()


async def ttft(
    client: aiohttp.ClientSession, url: str, headers: dict[str, str], body: bytes
) -> float:
    """Seconds from sending the request to the first content chunk; the stream is read out."""
    start = time.perf_counter()
    async with client.post(url, data=body, headers=headers) as resp:
        resp.raise_for_status()
        first: float | None = None
        async for chunk in resp.content.iter_any():
            if first is None and b'"content"' in chunk:
                first = time.perf_counter() - start
        assert first is not None
        return first


async def run_level(
    targets: list[tuple[str, dict[str, str]]], conc: int, total: int, body: bytes
) -> list[list[float]]:
    """``conc`` workers, each alternating between the targets; TTFT samples per target.

    Interleaving makes direct and routed calls share the same moment's load
    (this machine is shared), so their difference is the router's cost.
    """
    connector = aiohttp.TCPConnector(limit=0)
    async with aiohttp.ClientSession(connector=connector) as client:
        for url, headers in targets:  # warm connections
            await asyncio.gather(*(ttft(client, url, headers, body) for _ in range(min(conc, 50))))
        samples: list[list[float]] = [[] for _ in targets]
        per_worker = max(1, total // conc)

        async def worker(offset: int) -> None:
            for i in range(per_worker * len(targets)):
                which = (i + offset) % len(targets)
                url, headers = targets[which]
                samples[which].append(await ttft(client, url, headers, body))

        await asyncio.gather(*(worker(w) for w in range(conc)))
        return samples


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(len(ordered) * q))] * 1000.0


def wait_http(url: str, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if httpx.get(url, timeout=1).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.1)
    raise TimeoutError(url)


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def cpu_seconds(pid: int) -> float:
    """User + system CPU a process has used (Linux /proc), scheduling noise excluded."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def router_overhead_histogram(router: str) -> str:
    lines = httpx.get(router + "/metrics").text.splitlines()
    buckets = [x for x in lines if x.startswith("router_added_latency_seconds_bucket")]
    count = next(x for x in lines if x.startswith("router_added_latency_seconds_count"))
    total = float(count.split()[-1])
    out = []
    for line in buckets:
        le = line.split('le="')[1].split('"')[0]
        share = float(line.split()[-1]) / total if total else 0.0
        out.append(f"<= {le}s: {share:.1%}")
    return f"n={int(total)}; " + ", ".join(out)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--requests", type=int, default=400, help="streams per level")
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 200])
    parser.add_argument("--serve-upstream", type=int, default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve_upstream is not None:
        import uvicorn

        uvicorn.run(upstream_app, host="127.0.0.1", port=args.serve_upstream, log_level="error")
        return 0

    env = {**os.environ, "PYTHONPATH": str(REPO)}
    up_port, router_port = free_port(), free_port()
    upstream = f"http://127.0.0.1:{up_port}"
    router = f"http://127.0.0.1:{router_port}"
    config = {
        "port": router_port,
        "auth": {"keys": [{"sha256": hashlib.sha256(KEY.encode()).hexdigest(), "tenant": "b"}]},
        "upstreams": [{"url": upstream, "tier": "edge", "region": "local", "id": "fake"}],
        "region": {"default": "local"},
        "routing": {"slow_start_s": 0},
    }
    procs: list[subprocess.Popen[bytes]] = []
    with tempfile.TemporaryDirectory() as tmp:
        cfg = Path(tmp) / "router.yaml"
        cfg.write_text(json.dumps(config))  # JSON is YAML
        try:
            procs.append(
                subprocess.Popen(
                    [sys.executable, __file__, "--serve-upstream", str(up_port)], env=env
                )
            )
            wait_http(upstream + "/ready")
            procs.append(
                subprocess.Popen(
                    [sys.executable, "-m", "geo_router", "serve", "--config", str(cfg)],
                    cwd=REPO,
                    env=env,
                )
            )
            wait_http(router + "/ready")
            auth = {"Authorization": f"Bearer {KEY}"}
            print(
                f"router-added TTFT, {args.requests} streams per level per target, loopback, "
                f"one run; load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores"
            )
            json_ct = {"Content-Type": "application/json"}
            targets = [
                (upstream + "/v1/chat/completions", json_ct),
                (router + "/v1/chat/completions", {**auth, **json_ct}),
            ]
            for conc in args.concurrency:
                # One stream at a time: short streams. Many: LLM-like ones (2 s, 40 chunks),
                # so the level means that many open streams, not that many requests a second.
                tokens, interval = (4, 5.0) if conc == 1 else (40, 50.0)
                body = request_body(tokens, interval)
                cpu_before = [cpu_seconds(p.pid) for p in procs]
                direct, routed = asyncio.run(run_level(targets, conc, args.requests, body))
                up_cpu, router_cpu = (
                    (cpu_seconds(p.pid) - b) * 1000.0 / len(routed)
                    for p, b in zip(procs, cpu_before, strict=True)
                )
                d50, d99 = pct(direct, 0.5), pct(direct, 0.99)
                r50, r99 = pct(routed, 0.5), pct(routed, 0.99)
                print(
                    f"concurrency {conc:>3} ({tokens} chunks {interval:g} ms apart): "
                    f"direct p50 {d50:7.2f} ms  p99 {d99:7.2f} ms | "
                    f"routed p50 {r50:7.2f} ms  p99 {r99:7.2f} ms | "
                    f"added p50 {r50 - d50:6.2f} ms  p99 {r99 - d99:6.2f} ms"
                )
                print(
                    f"                 CPU per routed stream: router {router_cpu:.2f} ms "
                    f"(upstream {up_cpu / 2:.2f} ms per stream, for scale)"
                )
            print("router's own added-latency histogram:", router_overhead_histogram(router))
        finally:
            for proc in procs:
                proc.send_signal(signal.SIGTERM)
            for proc in procs:
                try:
                    proc.wait(timeout=10)
                except subprocess.TimeoutExpired:
                    proc.kill()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
