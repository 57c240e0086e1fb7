"""A hung center after real long conversations: what a short hard request pays.

Issue 24's check, on the running local topology (``hybrid-llm up --detach
--no-fetch --netem``): ``--warm`` real ShareGPT conversations with long prompts
are sent to the center one at a time (``model=center``), so its TTFT history is
seconds long; then the center's process group (the gateway and its replicas)
is stopped with SIGSTOP, and short hard questions (``model=auto``: the router
itself must classify them hard) are sent. Each one's TTFT at the client, the
instance that answered and the router's reason are printed; then SIGCONT, and
the same questions again for comparison.

    .venv/bin/python -m studies.sharegpt_routing --cache ~/.cache/hybrid-llm/task-data \\
        --write var/sharegpt60.jsonl
    hybrid-llm up --detach --no-fetch --netem
    .venv/bin/python -m studies.hung_center --dataset var/sharegpt60.jsonl
    hybrid-llm down

What an operator should see: while the center is stopped, every short hard
request answered by an edge (reason ``hedge`` or a fallback) within about a
second, because its hedge delay and first-token deadline come from its own
predicted TTFT at the center (a few hundred ms), not the center's P95 over the
long conversations (tens of seconds here).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import time
from pathlib import Path
from typing import Any

import httpx

from geo_router.conversation import estimate_prompt_tokens

# Short questions the router's classifier sends to the center (math, reasoning).
HARD = [
    "Solve for x: 3x^2 - 12x + 9 = 0. Show the steps.",
    "Prove that the square root of 2 is irrational.",
    "What is the derivative of x^3 * ln(x)? Explain each step.",
]


def _ttft(client: httpx.Client, url: str, key: str, body: dict[str, Any]) -> dict[str, Any]:
    started = time.perf_counter()
    headers = {"Authorization": f"Bearer {key}"}
    with client.stream("POST", url + "/v1/chat/completions", json=body, headers=headers) as r:
        first: float | None = None
        for line in r.iter_lines():
            if line.startswith("data: ") and '"content"' in line and first is None:
                first = time.perf_counter() - started
        return {
            "status": r.status_code,
            "ttft_ms": None if first is None else round(first * 1000.0, 1),
            "tier": r.headers.get("x-route-tier"),
            "instance": r.headers.get("x-route-instance"),
            "reason": r.headers.get("x-route-reason"),
        }


def _hedge_after(client: httpx.Client, url: str, key: str, body: dict[str, Any]) -> dict[str, Any]:
    """What the router plans for ``body`` (``/v1/route/explain``, read-only): the first
    candidate and its predicted P90 there, which is the hedge delay once learned."""
    r = client.post(
        url + "/v1/route/explain", json=body, headers={"Authorization": f"Bearer {key}"}
    )
    r.raise_for_status()
    first = (r.json().get("candidates") or [{}])[0]
    return {
        "first": first.get("id"),
        "predicted_ms": first.get("predicted_ttft_ms"),
        "p90_ms": first.get("predicted_ttft_p90_ms"),
    }


def _asked(question: str) -> dict[str, Any]:
    """A short question the router must classify itself (``model=auto``)."""
    messages = [{"role": "user", "content": question}]
    return {"model": "auto", "stream": True, "max_tokens": 8, "messages": messages}


def _center_pgid(state_file: Path) -> int:
    state = json.loads(state_file.read_text())
    center = next(c for c in state["children"] if c["name"] == "center")
    return os.getpgid(int(center["pid"]))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--url", default="http://127.0.0.1:8080")
    p.add_argument("--api-key", default="sk-local-dev")
    p.add_argument("--dataset", type=Path, required=True, help="JSONL of chat bodies")
    p.add_argument("--warm", type=int, default=20, help="long conversations sent first")
    p.add_argument("--min-tokens", type=int, default=300, help="a long prompt, estimated")
    p.add_argument("--max-tokens-prompt", type=int, default=1200)
    p.add_argument("--state", type=Path, default=Path("var/hybrid-llm.json"))
    args = p.parse_args()

    bodies = [json.loads(line) for line in args.dataset.read_text().splitlines() if line]
    long = [
        b for b in bodies if args.min_tokens <= estimate_prompt_tokens(b) <= args.max_tokens_prompt
    ]
    if len(long) < args.warm:
        raise SystemExit(f"only {len(long)} conversations in the range; lower --min-tokens")
    out: dict[str, Any] = {"warm": [], "hung": [], "after": []}
    with httpx.Client(timeout=180) as client:
        for body in long[: args.warm]:
            warm = {**body, "model": "center", "stream": True, "max_tokens": 8}
            out["warm"].append(_ttft(client, args.url, args.api_key, warm))
        pgid = _center_pgid(args.state)
        os.killpg(pgid, signal.SIGSTOP)
        try:
            for question in HARD:
                body = _asked(question)
                plan = _hedge_after(client, args.url, args.api_key, body)
                out["hung"].append({**_ttft(client, args.url, args.api_key, body), "plan": plan})
        finally:
            os.killpg(pgid, signal.SIGCONT)
        time.sleep(2.0)
        for question in HARD:
            body = _asked(question)
            plan = _hedge_after(client, args.url, args.api_key, body)
            out["after"].append({**_ttft(client, args.url, args.api_key, body), "plan": plan})
    warm_ttfts = sorted(w["ttft_ms"] for w in out["warm"] if w["ttft_ms"] is not None)
    print(
        f"warm-up: {len(out['warm'])} long conversations at the center, TTFT "
        f"{warm_ttfts[0]:.0f}-{warm_ttfts[-1]:.0f} ms"
    )
    for phase in ("hung", "after"):
        for row in out[phase]:
            print(f"{phase:5s} {row}")


if __name__ == "__main__":
    main()
