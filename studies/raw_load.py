"""A load generator lean enough to measure a router's sub-millisecond cost.

One keep-alive connection per worker and target, raw HTTP/1.1 written by
hand and parsed with httptools (an httpx client's own overhead per request is
of the order of what is measured), TTFT at the first content chunk. Used by
``studies.router_overhead``; the request bodies speak its fake upstream's
protocol (the chunk spacing in ``metadata.bench_interval_ms``).
"""

from __future__ import annotations

import asyncio
import json
import time
from urllib.parse import urlsplit

import httptools

__all__ = ["pct", "request_body", "run_level"]


def request_body(
    tokens: int,
    interval_ms: float,
    model: str = "bench",
    messages: list[dict[str, str]] | None = None,
) -> bytes:
    """A chat request (``messages``, else "hi"); the fake upstream streams ``tokens``
    chunks ``interval_ms`` apart."""
    messages = messages or [{"role": "user", "content": "hi"}]
    body = {"model": model, "stream": True, "messages": messages, "max_tokens": tokens}
    # In OpenAI's free-form metadata: the router refuses fields outside the OpenAI surface.
    body["metadata"] = {"bench_interval_ms": str(interval_ms)}
    return json.dumps(body).encode()


class _Conn(asyncio.Protocol):
    """One keep-alive connection of the load generator; TTFT at the first content chunk."""

    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.parser = httptools.HttpResponseParser(self)
        self.started = 0.0
        self.first: float | None = None
        self.done: asyncio.Future[None] | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        self.parser.feed_data(data)

    def connection_lost(self, exc: Exception | None) -> None:
        if self.done is not None and not self.done.done():
            self.done.set_exception(ConnectionError("connection closed mid-response"))

    def on_body(self, body: bytes) -> None:
        if self.first is None and b'"content"' in body:
            self.first = time.perf_counter() - self.started

    def on_message_complete(self) -> None:
        if self.done is not None and not self.done.done():
            self.done.set_result(None)

    async def ttft(self, request: bytes) -> float:
        """Seconds from sending ``request`` to the first content chunk; the stream is read out."""
        assert self.transport is not None
        self.parser = httptools.HttpResponseParser(self)
        self.first = None
        self.done = asyncio.get_running_loop().create_future()
        self.started = time.perf_counter()
        self.transport.write(request)
        async with asyncio.timeout(60):
            await self.done
        status = self.parser.get_status_code()
        if status != 200 or self.first is None:
            raise RuntimeError(f"bad response: status {status}")
        return self.first


def http_request(url: str, headers: dict[str, str], body: bytes) -> bytes:
    """The raw bytes of one keep-alive POST."""
    parts = urlsplit(url)
    lines = [f"POST {parts.path} HTTP/1.1", f"host: {parts.netloc}"]
    lines += [f"{k}: {v}" for k, v in {**headers, "content-length": str(len(body))}.items()]
    return ("\r\n".join(lines) + "\r\n\r\n").encode() + body


async def connect(url: str) -> _Conn:
    parts = urlsplit(url)
    loop = asyncio.get_running_loop()
    host, port = parts.hostname or "127.0.0.1", parts.port or 80
    _, conn = await loop.create_connection(_Conn, host, port)
    return conn


async def run_level(
    targets: list[tuple[str, dict[str, str]]],
    conc: int,
    total: int,
    bodies: list[list[bytes]],
    stagger_s: float,
) -> list[list[float]]:
    """``conc`` workers, each alternating between the targets; TTFT samples per target.
    ``bodies[t]`` are target ``t``'s requests, taken in turn (each target gets the
    same conversations).

    Worker ``w`` starts ``w * stagger_s`` late (0: all at once, the lock-step
    load). Interleaving makes direct and routed calls share the same moment's
    load (this machine is shared), so their difference is the router's cost.
    """
    requests = [
        [http_request(url, headers, body) for body in variants]
        for (url, headers), variants in zip(targets, bodies, strict=True)
    ]
    conns = [[await connect(url) for url, _ in targets] for _ in range(conc)]
    models = [json.loads(variants[0])["model"] for variants in bodies]
    warm = [
        http_request(url, headers, request_body(2, 1.0, model))
        for (url, headers), model in zip(targets, models, strict=True)
    ]
    for group in range(0, conc, 50):  # warm every connection (and the router's pool)
        batch = conns[group : group + 50]
        await asyncio.gather(*(c.ttft(warm[i]) for cs in batch for i, c in enumerate(cs)))
    samples: list[list[float]] = [[] for _ in targets]
    per_worker = max(1, total // conc)

    async def worker(w: int) -> None:
        await asyncio.sleep(w * stagger_s)
        for i in range(per_worker * len(targets)):
            which = (i + w) % len(targets)
            mine = requests[which]
            request = mine[(w * per_worker + i // len(targets)) % len(mine)]
            samples[which].append(await conns[w][which].ttft(request))

    try:
        await asyncio.gather(*(worker(w) for w in range(conc)))
    finally:
        for cs in conns:
            for c in cs:
                if c.transport is not None:
                    c.transport.close()
    return samples


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(len(ordered) * q))] * 1000.0
