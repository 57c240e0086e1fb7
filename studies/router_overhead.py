"""Router-added TTFT: the same fast fake upstream called directly and through the router.

    .venv/bin/python -m studies.router_overhead [--requests 400] [--concurrency 1 200]
        [--pin auto|always|never] [--nice N] [--burst] [--tls] [--tracing]
        [--sharegpt N | --realistic N]

Starts, as separate processes on loopback: a fast fake OpenAI upstream (raw
ASGI under uvicorn; first token at once, then ``max_tokens - 1`` more every
``metadata.bench_interval_ms``, so streams stay open and concurrency is real) and
``geo-router serve`` in front of it. For each concurrency level it keeps
that many streams open at once, each worker alternating between the upstream
directly and the router, and prints TTFT p50/p99 of both and their
difference (the router-added latency), the router's CPU per stream, and the
router's own ``router_added_latency_seconds`` histogram. Targets: p50 <= 1 ms,
p99 <= 5 ms. One run, figures printed; nothing asserted.

How the load is shaped, and why (this is the method since the router's
performance pass; the earlier one is what ``--burst`` still shows):

* **Steady arrivals.** At 200 streams the workers used to start together and,
  every stream lasting the same 2 s, stayed in lock-step: 200 requests arrived
  in the same millisecond every 2 s, so the figure was mostly the queue behind
  100 simultaneous arrivals at each process, not the router's per-request
  cost. Workers now start ``stream length / concurrency`` apart, so the same
  200 streams are open at every moment and requests arrive evenly (100 a
  second). ``--burst`` prints the lock-step figure too, for comparison.
* **Pinning** (``--pin auto``, the default: at levels above 1 on 2+ cores):
  the router gets a core of its own, the load generator and the fake upstream
  share the other, as if the router ran on its own host. Without it the three
  processes fight for 2 cores at 200 streams and every request of one waits
  behind the others' work. At one stream nothing competes, and a pinned,
  mostly idle router core only adds this VM's cost of waking a halted vCPU
  (measured: pinned 1-stream runs were slower and noisier), so ``auto`` leaves
  that level unpinned; ``always``/``never`` force either way for comparison.
* **Priority** (``--nice -10``, the default, when allowed; ``--nice 0`` turns it
  off): the three processes run at a raised priority, so unrelated work that
  shares this VM (other agents' test runs, which do not hold the benchmark
  lock) cannot hold a woken process off its core for a scheduler slice. A
  routed request has two more wake-ups on its path than a direct one, so such
  delays showed up as "router-added" milliseconds that were not the router's.
* **A cheap load generator**: one keep-alive connection per worker and target
  and ``httptools`` parsing (no aiohttp machinery per request), so the client
  measuring TTFT is not itself the bottleneck at 200 streams.

Direct and routed calls stay interleaved in the same run (each worker
alternates), so both see the same moment's load on a shared machine.

``--tls`` adds a second fake upstream serving HTTPS with a certificate from a
private CA made for the run (trustme), registered as the ``center`` tier;
the router verifies it against that CA bundle and sends a service token to
both tiers (``peers``). Each worker then alternates over three targets:
the plain upstream directly, the router to the plain upstream (``model:
edge``) and the router to the TLS upstream (``model: center``), so the TLS
hop's cost is the difference of the two routed columns, measured in the
same run. The router's keep-alive pool reuses its TLS connections (they are
opened during the warm-up), so this is the per-request cost of encryption,
not of handshakes.

``--tracing`` adds a second router, the same but for ``tracing.enabled``
with every request sampled, exporting to an OTLP/HTTP sink started for the
run (it answers 200 and keeps nothing). Each worker alternates direct, the
untraced router and the traced one, so the cost of tracing is the
difference of the two routed columns, measured in the same run, and its CPU
(the batch exporter's thread included) is the traced router's CPU per stream.
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
from pathlib import Path
from typing import Any

import httpx

from hybrid_llm.local.servers import free_port, wait_ready
from servekit.asgi import Receive, Scope, Send
from studies.raw_load import pct, request_body, run_level

REPO = Path(__file__).resolve().parents[1]
KEY = "sk-bench"


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
    pace = float((body.get("metadata") or {}).get("bench_interval_ms", 5))
    tokens, interval_s = body.get("max_tokens", 4), pace / 1000
    headers = [(b"content-type", b"text/event-stream")]
    await send({"type": "http.response.start", "status": 200, "headers": headers})
    await send({"type": "http.response.body", "body": _chunk(0, "Hello"), "more_body": True})
    for i in range(1, tokens):
        await asyncio.sleep(interval_s)
        await send({"type": "http.response.body", "body": _chunk(i, " tok"), "more_body": True})
    tail = _chunk(9, None, "stop") + b"data: [DONE]\n\n"
    await send({"type": "http.response.body", "body": tail})


async def otlp_sink(scope: Scope, receive: Receive, send: Send) -> None:
    """An OTLP/HTTP traces endpoint that accepts every export and keeps nothing."""
    if scope["type"] == "lifespan":
        await upstream_app(scope, receive, send)
        return
    more = True
    while more:
        more = (await receive()).get("more_body", False)
    headers = [(b"content-type", b"application/x-protobuf"), (b"content-length", b"0")]
    await send({"type": "http.response.start", "status": 200, "headers": headers})
    await send({"type": "http.response.body", "body": b""})


def pin(upstream_pids: list[int], router_pids: list[int], on: bool) -> str:
    """Routers on the last core, this load generator and the upstreams on the first (or unpin)."""
    cpus = set(range(os.cpu_count() or 1))
    if not on or len(cpus) < 2:
        for pid in (*router_pids, *upstream_pids, 0):
            os.sched_setaffinity(pid, cpus)
        return "not pinned"
    first, last = min(cpus), max(cpus)
    for pid in router_pids:
        os.sched_setaffinity(pid, {last})
    for pid in (*upstream_pids, 0):
        os.sched_setaffinity(pid, {first})
    return f"router pinned to cpu {last}, load generator and upstreams to cpu {first}"


def make_certificates(directory: Path) -> tuple[Path, list[str]]:
    """A private CA and a certificate for 127.0.0.1 (trustme, a dev dependency)."""
    import trustme

    ca = trustme.CA()
    ca_file, cert_file, key_file = (directory / n for n in ("ca.pem", "up.pem", "up.key"))
    ca.cert_pem.write_to_path(str(ca_file))
    issued = ca.issue_cert("127.0.0.1")
    issued.cert_chain_pems[0].write_to_path(str(cert_file))
    issued.private_key_pem.write_to_path(str(key_file))
    return ca_file, [str(cert_file), str(key_file)]


def prioritise(pids: list[int], nice: int) -> str:
    """Set the processes' nice value (raising priority needs privileges; else left as is)."""
    try:
        for pid in pids:
            os.setpriority(os.PRIO_PROCESS, pid, nice)
    except PermissionError:
        return "priority unchanged (not permitted)"
    return f"nice {nice}"


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


def realistic_requests(n: int) -> list[list[dict[str, str]] | None]:
    """``n`` first requests of the bench's realistic workload, drawn as the bench
    draws them (its seed 0): each conversation's opening messages and first turn."""
    from hybrid_llm.bench.conversations import builtin_workload

    workload = builtin_workload("realistic", "auto")
    out: list[list[dict[str, str]] | None] = []
    for _ in range(n):
        c = workload.conversation()
        out.append([*c.prefix, {"role": "user", "content": c.turns[0]}])
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--requests", type=int, default=400, help="streams per level")
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 200])
    parser.add_argument(
        "--burst", action="store_true", help="also run each level >1 with lock-step arrivals"
    )
    parser.add_argument(
        "--pin", choices=["auto", "always", "never"], default="auto", help="see the docstring"
    )
    parser.add_argument("--nice", type=int, default=-10, help="priority of the processes")
    parser.add_argument(
        "--tls", action="store_true", help="also route to an HTTPS upstream (see the docstring)"
    )
    parser.add_argument(
        "--tracing", action="store_true", help="also route through a traced router (docstring)"
    )
    parser.add_argument(
        "--sharegpt",
        type=int,
        default=0,
        metavar="N",
        help="send N real ShareGPT conversations (history up to a user turn) in turn "
        "instead of 'hi' (needs the datasets extra)",
    )
    parser.add_argument(
        "--realistic",
        type=int,
        default=0,
        metavar="N",
        help="send N requests of hybrid-llm bench's default 'realistic' conversation "
        "workload (each a conversation's opening messages and first turn) instead of 'hi'",
    )
    parser.add_argument("--serve-upstream", type=int, default=None, help=argparse.SUPPRESS)
    parser.add_argument("--serve-otlp", type=int, default=None, help=argparse.SUPPRESS)
    parser.add_argument("--cert", nargs=2, default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve_otlp is not None:
        import uvicorn

        uvicorn.run(otlp_sink, host="127.0.0.1", port=args.serve_otlp, log_level="error")
        return 0
    if args.serve_upstream is not None:
        import uvicorn

        tls = {"ssl_certfile": args.cert[0], "ssl_keyfile": args.cert[1]} if args.cert else {}
        # Keep-alive past the longest idle gap of a worker's connection (three
        # targets at 200 streams leave one idle for several seconds).
        uvicorn.run(
            upstream_app,
            host="127.0.0.1",
            port=args.serve_upstream,
            log_level="error",
            timeout_keep_alive=75,
            **tls,
        )
        return 0

    env = {**os.environ, "PYTHONPATH": str(REPO)}
    up_port, tls_port, router_port = free_port(), free_port(), free_port()
    sink_port, traced_port = free_port(), free_port()
    upstream = f"http://127.0.0.1:{up_port}"
    tls_upstream = f"https://127.0.0.1:{tls_port}"
    router = f"http://127.0.0.1:{router_port}"
    traced_router = f"http://127.0.0.1:{traced_port}"
    config: dict[str, Any] = {
        "server": {"port": router_port},
        "auth": {"keys": [{"sha256": hashlib.sha256(KEY.encode()).hexdigest(), "tenant": "b"}]},
        "upstreams": [{"url": upstream, "tier": "edge", "region": "local", "id": "fake"}],
        "region": {"default": "local"},
        "routing": {"slow_start_s": 0},
    }
    conversations: list[list[dict[str, str]] | None] = [None]
    if args.sharegpt:
        from studies.sharegpt import load

        conversations = [messages for messages, _ in load(args.sharegpt, max_tokens=6000)]
    elif args.realistic:
        conversations = realistic_requests(args.realistic)
    procs: list[subprocess.Popen[bytes]] = []
    with tempfile.TemporaryDirectory() as tmp:
        cfg = Path(tmp) / "router.yaml"
        cert: list[str] = []
        if args.tls:
            ca_file, cert = make_certificates(Path(tmp))
            config["upstreams"].append(
                {"url": tls_upstream, "tier": "center", "region": "local", "id": "fake-tls"}
            )
            token = {"token": "svc-bench"}
            config["peers"] = {"edge": token, "center": {**token, "ca_file": str(ca_file)}}
        cfg.write_text(json.dumps(config))  # JSON is YAML
        traced_cfg = Path(tmp) / "traced-router.yaml"
        tracing = {"enabled": True, "endpoint": f"http://127.0.0.1:{sink_port}/v1/traces"}
        traced_config = {**config, "server": {"port": traced_port}, "tracing": tracing}
        traced_cfg.write_text(json.dumps(traced_config))
        try:
            procs.append(
                subprocess.Popen(
                    [sys.executable, __file__, "--serve-upstream", str(up_port)], env=env
                )
            )
            wait_ready(upstream)
            if args.tls:
                argv = [sys.executable, __file__, "--serve-upstream", str(tls_port), "--cert"]
                procs.append(subprocess.Popen([*argv, *cert], env=env))
                wait_ready(tls_upstream, 60, verify=str(ca_file))
            procs.append(
                subprocess.Popen(
                    [sys.executable, "-m", "geo_router", "serve", "--config", str(cfg)],
                    cwd=REPO,
                    env=env,
                )
            )
            router_proc = procs[-1]
            wait_ready(router, 60)
            router_procs = [router_proc]
            if args.tracing:
                argv = [sys.executable, __file__, "--serve-otlp", str(sink_port)]
                procs.append(subprocess.Popen(argv, env=env))
                argv = [sys.executable, "-m", "geo_router", "serve", "--config", str(traced_cfg)]
                procs.append(subprocess.Popen(argv, cwd=REPO, env=env))
                router_procs.append(procs[-1])
                wait_ready(traced_router, 60)
            auth = {"Authorization": f"Bearer {KEY}"}
            print(
                f"router-added TTFT, {args.requests} streams per level per target, loopback, "
                f"one run; load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores; "
                f"{prioritise([p.pid for p in procs] + [os.getpid()], args.nice)}"
            )
            json_ct = {"Content-Type": "application/json"}
            targets = [
                (upstream + "/v1/chat/completions", json_ct),
                (router + "/v1/chat/completions", {**auth, **json_ct}),
            ]
            models = ["bench", "edge"]
            if args.tls:
                targets.append((router + "/v1/chat/completions", {**auth, **json_ct}))
                models.append("center")
            if args.tracing:
                targets.append((traced_router + "/v1/chat/completions", {**auth, **json_ct}))
                models.append("edge")
            upstream_procs = [p for p in procs if p not in router_procs]
            for conc in args.concurrency:
                # One stream at a time: short streams. Many: LLM-like ones (2 s, 40 chunks),
                # so the level means that many open streams, not that many requests a second.
                tokens, interval = (4, 5.0) if conc == 1 else (40, 50.0)
                bodies = [
                    [request_body(tokens, interval, m, c) for c in conversations] for m in models
                ]
                shapes = [("steady", tokens * interval / 1000.0 / conc)]
                if args.burst and conc > 1:
                    shapes.append(("lock-step", 0.0))
                pinned = args.pin == "always" or (args.pin == "auto" and conc > 1)
                router_pids = [p.pid for p in router_procs]
                print(f"  {pin([p.pid for p in upstream_procs], router_pids, pinned)}")
                for shape, stagger_s in shapes:
                    cpu_before = [cpu_seconds(p.pid) for p in procs]
                    samples = asyncio.run(
                        run_level(targets, conc, args.requests, bodies, stagger_s)
                    )
                    direct, routed = samples[0], samples[1]
                    cpu = {
                        p.pid: (cpu_seconds(p.pid) - b) * 1000.0 / len(routed)
                        for p, b in zip(procs, cpu_before, strict=True)
                    }
                    d50, d99 = pct(direct, 0.5), pct(direct, 0.99)
                    r50, r99 = pct(routed, 0.5), pct(routed, 0.99)
                    print(
                        f"concurrency {conc:>3} ({tokens} chunks {interval:g} ms apart, {shape}): "
                        f"direct p50 {d50:7.2f} ms  p99 {d99:7.2f} ms | "
                        f"routed p50 {r50:7.2f} ms  p99 {r99:7.2f} ms | "
                        f"added p50 {r50 - d50:6.2f} ms  p99 {r99 - d99:6.2f} ms"
                    )
                    if args.tls:
                        t50, t99 = pct(samples[2], 0.5), pct(samples[2], 0.99)
                        print(
                            f"    routed over TLS p50 {t50:7.2f} ms  p99 {t99:7.2f} ms | "
                            f"added p50 {t50 - d50:6.2f} ms  p99 {t99 - d99:6.2f} ms | "
                            f"TLS hop vs plain hop p50 {t50 - r50:+.2f} ms  p99 {t99 - r99:+.2f} ms"
                        )
                    if args.tracing:
                        t50, t99 = pct(samples[-1], 0.5), pct(samples[-1], 0.99)
                        print(
                            f"    routed traced p50 {t50:7.2f} ms  p99 {t99:7.2f} ms | "
                            f"added p50 {t50 - d50:6.2f} ms  p99 {t99 - d99:6.2f} ms | "
                            f"traced vs untraced p50 {t50 - r50:+.2f} ms  p99 {t99 - r99:+.2f} ms"
                            f" | traced router CPU {cpu[router_procs[1].pid]:.2f} ms per stream"
                        )
                    # Per routed stream of the untraced router (the traced one has its own).
                    router_ms = cpu[router_proc.pid] / (len(targets) - len(router_procs))
                    upstream_ms = sum(cpu[p.pid] for p in upstream_procs) / len(targets)
                    print(
                        f"    CPU per routed stream: router {router_ms:.2f} ms "
                        f"(upstreams {upstream_ms:.2f} ms per stream, for scale); "
                        f"load average {os.getloadavg()[0]:.1f}"
                    )
            print("router's own added-latency histogram:", router_overhead_histogram(router))
        finally:
            # Last started first: the traced router flushes its spans before the sink goes.
            for proc in reversed(procs):
                proc.send_signal(signal.SIGTERM)
                try:
                    proc.wait(timeout=10)
                except subprocess.TimeoutExpired:
                    proc.kill()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
