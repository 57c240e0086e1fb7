"""Edge agent over HTTP versus llama-cpp-python in-process, same model and prompt.

Prints, from one run:
  * TTFT and decode tokens/s: in-process ``Llama`` streaming vs the edge agent
    (a real ``edge-agent serve`` subprocess, streamed over HTTP), taking turns
    in blocks so that the machine's drift hits both alike, for two prompts:
    - ``fresh``: every request a new prompt (a different first word, the same
      sequence of prompts on both sides), so TTFT is the prompt's prefill plus
      the first token, as for a user's request;
    - ``repeated``: the same prompt every time. Both sides then keep it in the
      context and evaluate only its last token again, so TTFT is a single
      decode step (~14 ms here): the harshest ratio, since whatever the agent
      adds (HTTP, two thread hand-offs) is measured against almost nothing;
  * TTFT with a cached ~1k-token system prompt vs a cold one, through the agent.

Ratios are read as the median over matched requests (the k-th request of
each side: the same prompt, one block apart), which cancels the prompt's own
cost and the drift; the ratio of the two sides' medians is printed as well.

Usage: .venv/bin/python -m studies.edge_vs_inprocess [--runs 16] [--tokens 64]
       [--engine llama|llama-batching]
Targets (issue 2): TTFT ratio <= 1.05, decode ratio >= 0.95, cached/cold <= 0.1.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import socket
import statistics
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx

from hybrid_llm.local.servers import free_port, service_process

REPO = Path(__file__).resolve().parents[1]

MODEL = REPO / "models" / "SmolLM2-135M-Instruct.Q4_1.gguf"
PROMPT = "The history of the printing press begins"
# First words for fresh prompts, each its own first token: nothing is shared with
# the prompt before it (on either side; this model adds no BOS token).
OPENERS = (  # noqa: SIM905 (a list of words, not of strings)
    "Lisbon Oslo Vienna Cairo Accra Quito Dublin Prague Seoul Delhi Tokyo Paris Rome Madrid "
    "Berlin Athens Sydney Toronto Chicago Boston Denver Austin Miami Manila Moscow Warsaw "
    "Budapest Helsinki Stockholm Beijing Brussels Amsterdam Geneva Zurich Milan Naples"
).split()
N_CTX = 2048


def prompts(fresh: bool) -> Iterator[str]:
    """The prompts one side sends, in order (both sides get the same sequence)."""
    for i in itertools.count():
        yield f"{OPENERS[i % len(OPENERS)]}: {PROMPT.lower()}" if fresh else PROMPT


def inprocess_stream(llama: Any, prompt: str, tokens: int) -> tuple[float, float]:
    """TTFT and decode tokens/s of one in-process streamed completion."""
    start = time.perf_counter()
    times = []
    for _chunk in llama.create_completion(
        prompt, max_tokens=tokens, temperature=0.0, top_k=0, min_p=0.0, stream=True
    ):
        times.append(time.perf_counter())
    return times[0] - start, (len(times) - 1) / (times[-1] - times[0])


class HTTPStreamer:
    """Streams over one keep-alive socket, the request written in one segment.

    A raw client, because the thing measured is the agent: httpx's sync client
    added ~13 ms per request on loopback here (two writes meet delayed ACKs),
    which curl and this client do not.
    """

    def __init__(self, url: str, tokens: int) -> None:
        host, port = url.removeprefix("http://").split(":")
        self.tokens = tokens
        self.sock = socket.create_connection((host, int(port)))
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def stream(self, prompt: str) -> tuple[float, float]:
        """TTFT and decode tokens/s of one streamed completion through the agent."""
        payload = json.dumps(
            {"model": "edge", "prompt": prompt, "max_tokens": self.tokens, "temperature": 0,
             "stream": True}
        ).encode()  # fmt: skip
        request = (
            b"POST /v1/completions HTTP/1.1\r\nHost: bench\r\nContent-Type: application/json\r\n"
            + f"Content-Length: {len(payload)}\r\n\r\n".encode()
            + payload
        )
        start = time.perf_counter()
        self.sock.sendall(request)
        seen = b""
        times: list[float] = []
        while b"data: [DONE]" not in seen:
            chunk = self.sock.recv(65536)
            if not chunk:
                raise RuntimeError("agent closed the connection")
            now = time.perf_counter()
            times += [now] * (chunk.count(b'"text":"') - chunk.count(b'"text":""'))
            seen = seen[-32:] + chunk
        return times[0] - start, (len(times) - 1) / (times[-1] - times[0])

    def close(self) -> None:
        self.sock.close()


def interleaved(
    url: str, runs: int, tokens: int, block: int, fresh: bool
) -> dict[str, list[float]]:
    """The same completions in-process and through the agent, in alternating blocks.

    This machine's speed drifts by tens of percent over minutes, so the two
    sides take turns in blocks of ``block`` requests (A B B A ...), and the
    first request of every block is dropped: it only pays for the other
    side's model having pushed this one's out of the CPU caches.
    """
    from llama_cpp import Llama

    llama = Llama(str(MODEL), n_ctx=N_CTX, n_threads=2, n_threads_batch=2, verbose=False)
    http = HTTPStreamer(url, tokens)
    ip_prompts, http_prompts = prompts(fresh), prompts(fresh)
    out: dict[str, list[float]] = {"ip_ttft": [], "ip_rate": [], "http_ttft": [], "http_rate": []}
    sides: list[tuple[str, Callable[[], tuple[float, float]]]] = [
        ("ip", lambda: inprocess_stream(llama, next(ip_prompts), tokens)),
        ("http", lambda: http.stream(next(http_prompts))),
    ]
    try:
        for i in range(max(1, runs // (block - 1))):
            for name, run in sides if i % 2 == 0 else sides[::-1]:
                run()
                for _ in range(block - 1):
                    ttft, rate = run()
                    out[f"{name}_ttft"].append(ttft)
                    out[f"{name}_rate"].append(rate)
    finally:
        http.close()
        llama.close()
    return out


def paired_ratios(edge: list[float], inprocess: list[float]) -> tuple[float, float, float]:
    """Quartiles (Q1, median, Q3) of edge/in-process over matched requests.

    The k-th measured request of each side got the same prompt and ran one
    block apart, so its ratio cancels both the prompt's own cost and the
    machine's drift; the median of those ratios is the estimate the targets
    are read against. The ratio of the two medians is printed beside it.
    """
    ratios = [e / i for e, i in zip(edge, inprocess, strict=True)]
    q1, q2, q3 = statistics.quantiles(ratios, n=4)
    return q1, q2, q3


def system_prompt(tag: str) -> str:
    rules = " ".join(
        f"Rule {i}: answer politely, cite sources, avoid speculation, and keep answers short."
        for i in range(60)
    )
    return f"[{tag}] You are the support assistant of a travel company. {rules}"


def chat_ttft(client: httpx.Client, url: str, system: str, question: str) -> float:
    body = {
        "model": "edge", "max_tokens": 1, "temperature": 0, "stream": True,
        "messages": [{"role": "system", "content": system}, {"role": "user", "content": question}],
    }  # fmt: skip
    start = time.perf_counter()
    with client.stream("POST", url + "/v1/chat/completions", json=body) as resp:
        for line in resp.iter_lines():
            if line.startswith("data: {") and '"content":""' not in line and '"content"' in line:
                return time.perf_counter() - start
    raise RuntimeError("no token")


def cached_vs_cold(url: str, runs: int) -> tuple[list[float], list[float]]:
    cold, cached = [], []
    with httpx.Client(timeout=300) as client:
        for i in range(runs):
            tag = uuid.uuid4().hex
            cold.append(chat_ttft(client, url, system_prompt(tag), f"Question {i}: can I rebook?"))
            # Something else runs in between, so only the saved state can help.
            chat_ttft(client, url, system_prompt("other-" + tag), "Unrelated question.")
            cached.append(chat_ttft(client, url, system_prompt(tag), f"Question {i}: refunds?"))
    return cold, cached


def engine_yaml(engine: str) -> str:
    """The agent's engine section: the same model and thread count as in-process."""
    if engine == "llama-batching":
        return (
            f"{{kind: llama-batching, model_path: {MODEL}, model_name: smol, slots: 4,"
            f" ctx_per_slot: {N_CTX}, n_threads: 2, warmup_tokens: 4}}"
        )
    return (
        f"{{model_path: {MODEL}, model_name: smol, n_ctx: {N_CTX}, n_threads: 2,"
        " warmup_tokens: 4, prefix_cache: {enabled: true, capacity_mb: 512}}"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--runs", type=int, default=16, help="measured requests per side/prompt")
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--block", type=int, default=5, help="requests per side per turn")
    parser.add_argument("--engine", choices=["llama", "llama-batching"], default="llama")
    args = parser.parse_args()

    port = free_port()
    url = f"http://127.0.0.1:{port}"
    with tempfile.TemporaryDirectory() as tmp:
        cfg = Path(tmp) / "edge.yaml"
        cfg.write_text(
            f"server: {{host: 127.0.0.1, port: {port}, log_level: warning}}\n"
            f"engine: {engine_yaml(args.engine)}\n"
        )
        with service_process(["edge_agent", "serve", "--config", str(cfg)], url):
            modes = {
                mode: interleaved(url, args.runs, args.tokens, args.block, mode == "fresh")
                for mode in ("fresh", "repeated")
            }
            cold, cached = cached_vs_cold(url, max(3, args.runs // 2))
            with httpx.Client() as client:
                sys_tokens = client.post(url + "/v1/chat/completions", json={
                    "model": "edge", "max_tokens": 1,
                    "messages": [{"role": "system", "content": system_prompt("count")},
                                 {"role": "user", "content": "hi"}],
                }, timeout=300).json()["usage"]["prompt_tokens"]  # fmt: skip

    med = statistics.median
    result: dict[str, Any] = {"engine": args.engine}
    print(f"runs={args.runs} tokens={args.tokens} model={MODEL.name} engine={args.engine}")
    for mode, pairs in modes.items():
        ip_ttft, http_ttft = med(pairs["ip_ttft"]), med(pairs["http_ttft"])
        ip_rate, http_rate = med(pairs["ip_rate"]), med(pairs["http_rate"])
        ttft_q = paired_ratios(pairs["http_ttft"], pairs["ip_ttft"])
        rate_q = paired_ratios(pairs["http_rate"], pairs["ip_rate"])
        r = result[mode] = {
            "inprocess_ttft_ms": ip_ttft * 1000,
            "edge_ttft_ms": http_ttft * 1000,
            "added_ms": (http_ttft - ip_ttft) * 1000,
            "ttft_ratio_of_medians": http_ttft / ip_ttft,
            "ttft_ratio": ttft_q[1],
            "ttft_ratio_quartiles": ttft_q,
            "inprocess_decode_tok_s": ip_rate,
            "edge_decode_tok_s": http_rate,
            "decode_ratio_of_medians": http_rate / ip_rate,
            "decode_ratio": rate_q[1],
            "decode_ratio_quartiles": rate_q,
        }
        print(f"  {mode:<8} TTFT    in-process {r['inprocess_ttft_ms']:7.1f} ms  edge "
              f"{r['edge_ttft_ms']:7.1f} ms  (+{r['added_ms']:.2f} ms)  ratio of medians "
              f"{r['ttft_ratio_of_medians']:.3f}")  # fmt: skip
        print(f"  {mode:<8} TTFT    paired ratio {ttft_q[1]:.3f} (quartiles {ttft_q[0]:.3f}-"
              f"{ttft_q[2]:.3f})  (target <= 1.05)")  # fmt: skip
        print(f"  {mode:<8} decode  in-process {r['inprocess_decode_tok_s']:7.1f} t/s edge "
              f"{r['edge_decode_tok_s']:7.1f} t/s ratio of medians "
              f"{r['decode_ratio_of_medians']:.3f}, paired {rate_q[1]:.3f} (quartiles "
              f"{rate_q[0]:.3f}-{rate_q[2]:.3f})  (target >= 0.95)")  # fmt: skip
    result.update(
        system_prompt_tokens=sys_tokens,
        cold_ttft_ms=med(cold) * 1000,
        cached_ttft_ms=med(cached) * 1000,
        cached_over_cold=med(cached) / med(cold),
    )
    print(f"  {sys_tokens}-token system prompt: cold {result['cold_ttft_ms']:.1f} ms, cached "
          f"{result['cached_ttft_ms']:.1f} ms, ratio {result['cached_over_cold']:.3f}"
          "  (target <= 0.1)")  # fmt: skip
    print("  load average: " + " ".join(f"{v:.2f}" for v in os.getloadavg()))
    print(json.dumps(result))


if __name__ == "__main__":
    main()
