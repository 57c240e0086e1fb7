"""Where does same-city TTFT go? The same request, one at a time, along each hop.

    hybrid-llm up --netem --detach
    python -m studies.ttft_path --requests 15 \
        direct=http://127.0.0.1:8101 proxy=http://127.0.0.1:9101 \
        router-edge=http://127.0.0.1:8080@edge router-auto=http://127.0.0.1:8080@auto

Each target is ``NAME=URL[@MODEL]`` (model default ``edge``). Requests go one
at a time, round-robin over the targets (so machine drift hits every target
alike), spaced ``--gap`` seconds apart (an idle system, as at a low offered
load), each with a fresh prompt of ``--bucket`` size (no prefix-cache hits).
Every target keeps one keep-alive client, like the router's pool; with
``--new-connection`` every request opens its own connection instead (what a
proxy's emulated handshake costs). Targets that are not the router (port
8080 here) get the local topology's service token (edges accept nothing
else). Prints TTFT P50/P90/min per target, the route headers seen, and the
load average.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import time
from collections import Counter

import httpx

from hybrid_llm.bench import RequestRecord, Workload, parse_bucket
from hybrid_llm.bench.client import send_streaming
from hybrid_llm.bench.stats import percentile
from hybrid_llm.local.topology import service_headers


def _parse_target(text: str) -> tuple[str, str, str]:
    name, rest = text.split("=", 1)
    url, _, model = rest.partition("@")
    return name, url.rstrip("/"), model or "edge"


def _headers(url: str) -> dict[str, str]:
    # The router takes client API keys (and refuses unknown ones); the rest service tokens.
    return {} if url.endswith(":8080") else service_headers()


async def _one(
    client: httpx.AsyncClient | None, url: str, workload: Workload, bucket_text: str
) -> RequestRecord:
    bucket = parse_bucket(bucket_text)
    body = workload.body(bucket)
    if client is not None:
        return await send_streaming(
            client, workload.path, body, bucket=bucket.label, run_start=time.perf_counter()
        )
    async with httpx.AsyncClient(base_url=url, headers=_headers(url), timeout=120) as fresh:
        return await send_streaming(
            fresh, workload.path, body, bucket=bucket.label, run_start=time.perf_counter()
        )


async def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("targets", nargs="+", help="NAME=URL[@MODEL]")
    p.add_argument("--requests", type=int, default=15, help="per target")
    p.add_argument("--bucket", default="8:16")
    p.add_argument("--gap", type=float, default=0.5, help="seconds between requests")
    p.add_argument("--new-connection", action="store_true")
    args = p.parse_args()

    targets = [_parse_target(t) for t in args.targets]
    clients = {
        name: None
        if args.new_connection
        else httpx.AsyncClient(base_url=url, headers=_headers(url), timeout=120)
        for name, url, _ in targets
    }
    workloads = {name: Workload(model, [parse_bucket(args.bucket)]) for name, _, model in targets}
    results: dict[str, list[RequestRecord]] = {name: [] for name, _, _ in targets}
    try:
        for name, url, _ in targets:  # one warm-up each (connection, first-call costs)
            await _one(clients[name], url, workloads[name], args.bucket)
        for _ in range(args.requests):
            for name, url, _ in targets:
                await asyncio.sleep(args.gap)
                results[name].append(await _one(clients[name], url, workloads[name], args.bucket))
    finally:
        for client in clients.values():
            if client is not None:
                await client.aclose()
    print(f"{'target':<14}{'ok':>4}{'p50 ms':>9}{'p90 ms':>9}{'min ms':>9}{'prompt':>8}  routes")
    for name, _, _ in targets:
        ok = [r for r in results[name] if r.ok and r.ttft is not None]
        ttft = [r.ttft * 1000 for r in ok if r.ttft is not None]
        routes = Counter(f"{r.tier}/{r.region}" for r in ok)
        prompt = statistics.median(r.prompt_tokens for r in ok) if ok else 0
        print(
            f"{name:<14}{len(ok):>4}{percentile(ttft, 50) or 0:>9.1f}"
            f"{percentile(ttft, 90) or 0:>9.1f}{min(ttft, default=0):>9.1f}{prompt:>8.0f}  "
            + ", ".join(f"{k}:{v}" for k, v in routes.items())
        )
        errors = Counter(r.error for r in results[name] if not r.ok)
        for error, count in errors.items():
            print(f"  {count} x {error}")
    print("load average: " + " ".join(f"{v:.2f}" for v in os.getloadavg()))


if __name__ == "__main__":
    asyncio.run(main())
