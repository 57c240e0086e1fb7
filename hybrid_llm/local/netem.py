"""Emulated geography on one machine: an asyncio TCP proxy that delays each
direction by a fixed one-way time.

Each chunk read is stamped ``now + delay`` and written when that time comes,
so the link keeps its throughput (chunks in flight overlap) while every byte
arrives ``delay`` late, like a long fat pipe rather than a slow one. A new
connection also pays one round trip before the upstream sees it, as a TCP
handshake over that distance would. Put one proxy in front of each upstream
with the delay from the region RTT table and point the router at the proxies.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import signal
import time
from dataclasses import dataclass

__all__ = ["DelayProxy", "ProxyRoute", "parse_route", "register", "serve_routes"]

_CHUNK = 65536


@dataclass(frozen=True)
class ProxyRoute:
    """Listen on ``listen``; forward to ``upstream``; ``rtt_ms`` split over both ways."""

    listen_host: str
    listen_port: int
    upstream_host: str
    upstream_port: int
    rtt_ms: float


def parse_route(text: str) -> ProxyRoute:
    """``LISTEN_PORT=UPSTREAM_HOST:PORT@RTT_MS`` (listen host 127.0.0.1)."""
    try:
        listen, rest = text.split("=", 1)
        upstream, rtt = rest.rsplit("@", 1)
        host, port = upstream.rsplit(":", 1)
        return ProxyRoute("127.0.0.1", int(listen), host, int(port), float(rtt))
    except ValueError:
        raise ValueError(f"route {text!r}: expected LISTEN_PORT=HOST:PORT@RTT_MS") from None


class DelayProxy:
    """One listening socket forwarding every connection to one upstream."""

    def __init__(self, route: ProxyRoute) -> None:
        self.route = route
        self.delay = route.rtt_ms / 2000.0
        self._server: asyncio.Server | None = None
        self._conns: set[asyncio.Task[None]] = set()

    @property
    def port(self) -> int:
        if self._server is None:
            raise RuntimeError("proxy not started")
        port: int = self._server.sockets[0].getsockname()[1]
        return port

    async def start(self) -> None:
        self._server = await asyncio.start_server(
            self._accept, self.route.listen_host, self.route.listen_port
        )

    async def aclose(self) -> None:
        if self._server is not None:
            self._server.close()
        for task in list(self._conns):
            task.cancel()
        await asyncio.gather(*self._conns, return_exceptions=True)
        if self._server is not None:
            await self._server.wait_closed()

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._conns.add(task)
        try:
            await self._serve(reader, writer)
        except asyncio.CancelledError:
            pass  # aclose() ends open connections; the server callback must not see it
        finally:
            self._conns.discard(task)
            writer.close()
            with contextlib.suppress(OSError, asyncio.CancelledError):
                await writer.wait_closed()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        # The emulated handshake: what the client sent meanwhile waits in the
        # socket buffer and leaves one way-delay after the connection exists.
        await asyncio.sleep(2 * self.delay)
        try:
            up_reader, up_writer = await asyncio.open_connection(
                self.route.upstream_host, self.route.upstream_port
            )
        except OSError:
            return
        to_upstream: asyncio.Queue[tuple[float, bytes]] = asyncio.Queue()
        read_client = asyncio.create_task(self._read(reader, to_upstream))
        to_client: asyncio.Queue[tuple[float, bytes]] = asyncio.Queue()
        tasks = [
            read_client,
            asyncio.create_task(self._write(to_upstream, up_writer)),
            asyncio.create_task(self._read(up_reader, to_client)),
            asyncio.create_task(self._write(to_client, writer)),
        ]
        try:
            # Either side's writer finishing (EOF delivered or a reset) ends the pair.
            await asyncio.wait([tasks[1], tasks[3]], return_when=asyncio.ALL_COMPLETED)
        finally:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            up_writer.close()

    async def _read(
        self, reader: asyncio.StreamReader, queue: asyncio.Queue[tuple[float, bytes]]
    ) -> None:
        try:
            while chunk := await reader.read(_CHUNK):
                queue.put_nowait((time.monotonic() + self.delay, chunk))
        except OSError:
            pass
        queue.put_nowait((time.monotonic() + self.delay, b""))

    async def _write(
        self, queue: asyncio.Queue[tuple[float, bytes]], writer: asyncio.StreamWriter
    ) -> None:
        try:
            while True:
                due, chunk = await queue.get()
                wait = due - time.monotonic()
                if wait > 0:
                    await asyncio.sleep(wait)
                if not chunk:
                    if writer.can_write_eof():
                        writer.write_eof()
                    return
                writer.write(chunk)
                await writer.drain()
        except OSError:
            return


async def serve_routes(routes: list[ProxyRoute], stop: asyncio.Event) -> None:
    """Run one proxy per route until ``stop`` is set."""
    proxies = [DelayProxy(r) for r in routes]
    try:
        for proxy in proxies:
            await proxy.start()
        await stop.wait()
    finally:
        for proxy in proxies:
            await proxy.aclose()


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("netem", help="TCP delay proxies emulating inter-region RTT")
    p.add_argument(
        "--route",
        action="append",
        required=True,
        help="LISTEN_PORT=HOST:PORT@RTT_MS (repeatable), e.g. 9101=127.0.0.1:8101@40",
    )
    p.set_defaults(func=_run)


def _run(args: argparse.Namespace) -> int:
    try:
        routes = [parse_route(r) for r in args.route]
    except ValueError as exc:
        print(exc)
        return 2

    async def main() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, stop.set)
        await serve_routes(routes, stop)

    asyncio.run(main())
    return 0
