"""Edge agent over HTTP versus llama-cpp-python in-process, same model and prompt.

Prints, from one run:
  * TTFT and decode tokens/s: in-process ``Llama`` streaming vs the edge agent
    (a real ``edge-agent serve`` subprocess, streamed over HTTP), taking turns
    request by request so that the machine's drift hits both alike;
  * TTFT with a cached ~1k-token system prompt vs a cold one, through the agent.

Usage: .venv/bin/python bench/edge_vs_inprocess.py [--runs 15] [--tokens 64]
Targets (issue 2): TTFT ratio <= 1.05, decode ratio >= 0.95, cached/cold <= 0.1.
"""

from __future__ import annotations

import argparse
import json
import socket
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from tests.support.servers import free_port, service_process  # noqa: E402

MODEL = REPO / "models" / "SmolLM2-135M-Instruct.Q4_1.gguf"
PROMPT = "The history of the printing press begins"
N_CTX = 2048


def inprocess_stream(llama: Any, tokens: int) -> tuple[float, float]:
    """TTFT and decode tokens/s of one in-process streamed completion."""
    start = time.perf_counter()
    times = []
    for _chunk in llama.create_completion(
        PROMPT, max_tokens=tokens, temperature=0.0, top_k=0, min_p=0.0, stream=True
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
        payload = json.dumps(
            {"model": "edge", "prompt": PROMPT, "max_tokens": tokens, "temperature": 0,
             "stream": True}
        ).encode()  # fmt: skip
        self.request = (
            b"POST /v1/completions HTTP/1.1\r\nHost: bench\r\nContent-Type: application/json\r\n"
            + f"Content-Length: {len(payload)}\r\n\r\n".encode()
            + payload
        )
        self.sock = socket.create_connection((host, int(port)))
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def stream(self) -> tuple[float, float]:
        """TTFT and decode tokens/s of one streamed completion through the agent."""
        start = time.perf_counter()
        self.sock.sendall(self.request)
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


def interleaved(url: str, runs: int, tokens: int, block: int) -> dict[str, list[float]]:
    """The same completion in-process and through the agent, in alternating blocks.

    This machine's speed drifts by tens of percent over minutes, so the two
    sides take turns in blocks of ``block`` requests (A B B A ...), and the
    first request of every block is dropped: it only pays for the other
    side's model having pushed this one's out of the CPU caches.
    """
    from llama_cpp import Llama

    llama = Llama(str(MODEL), n_ctx=N_CTX, n_threads=2, n_threads_batch=2, verbose=False)
    http = HTTPStreamer(url, tokens)
    out: dict[str, list[float]] = {"ip_ttft": [], "ip_rate": [], "http_ttft": [], "http_rate": []}
    sides: list[tuple[str, Callable[[], tuple[float, float]]]] = [
        ("ip", lambda: inprocess_stream(llama, tokens)),
        ("http", http.stream),
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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--runs", type=int, default=15)
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--block", type=int, default=5, help="requests per side per turn")
    args = parser.parse_args()

    port = free_port()
    url = f"http://127.0.0.1:{port}"
    with tempfile.TemporaryDirectory() as tmp:
        cfg = Path(tmp) / "edge.yaml"
        cfg.write_text(
            f"server: {{host: 127.0.0.1, port: {port}, log_level: warning}}\n"
            f"engine: {{model_path: {MODEL}, model_name: smol, n_ctx: {N_CTX}, n_threads: 2,"
            f" warmup_tokens: 4, prefix_cache: {{enabled: true, capacity_mb: 512}}}}\n"
        )
        with service_process(["edge_agent", "serve", "--config", str(cfg)], url):
            pairs = interleaved(url, args.runs, args.tokens, args.block)
            cold, cached = cached_vs_cold(url, max(3, args.runs // 2))
            with httpx.Client() as client:
                sys_tokens = client.post(url + "/v1/chat/completions", json={
                    "model": "edge", "max_tokens": 1,
                    "messages": [{"role": "system", "content": system_prompt("count")},
                                 {"role": "user", "content": "hi"}],
                }, timeout=300).json()["usage"]["prompt_tokens"]  # fmt: skip
    ip_ttft, ip_rate = pairs["ip_ttft"], pairs["ip_rate"]
    http_ttft, http_rate = pairs["http_ttft"], pairs["http_rate"]

    med = statistics.median
    result = {
        "inprocess_ttft_ms": med(ip_ttft) * 1000,
        "edge_ttft_ms": med(http_ttft) * 1000,
        "ttft_ratio": med(http_ttft) / med(ip_ttft),
        "inprocess_decode_tok_s": med(ip_rate),
        "edge_decode_tok_s": med(http_rate),
        "decode_ratio": med(http_rate) / med(ip_rate),
        "system_prompt_tokens": sys_tokens,
        "cold_ttft_ms": med(cold) * 1000,
        "cached_ttft_ms": med(cached) * 1000,
        "cached_over_cold": med(cached) / med(cold),
    }
    r = result
    print(f"runs={args.runs} tokens={args.tokens} model={MODEL.name} (medians)")
    print(f"  TTFT    in-process {r['inprocess_ttft_ms']:8.1f} ms  edge {r['edge_ttft_ms']:8.1f} ms"
          f"  ratio {r['ttft_ratio']:.3f}  (target <= 1.05)")  # fmt: skip
    print(f"  decode  in-process {r['inprocess_decode_tok_s']:8.1f} t/s edge "
          f"{r['edge_decode_tok_s']:8.1f} t/s ratio {r['decode_ratio']:.3f}"
          "  (target >= 0.95)")  # fmt: skip
    print(f"  {sys_tokens}-token system prompt: cold {r['cold_ttft_ms']:.1f} ms, cached "
          f"{r['cached_ttft_ms']:.1f} ms, ratio {r['cached_over_cold']:.3f}"
          "  (target <= 0.1)")  # fmt: skip
    print(json.dumps(result))


if __name__ == "__main__":
    main()
