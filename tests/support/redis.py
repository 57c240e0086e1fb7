"""A real ``redis-server`` for tests: its own port, a password, no persistence.

``scripts/setup.sh --dev`` installs Debian's ``redis-server`` where it can;
tests that need it skip, saying why, on a machine without it.
"""

from __future__ import annotations

import shutil
import socket
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import pytest

from servekit.engine.process import free_port

PASSWORD = "test-redis-secret"


@dataclass
class RedisServer:
    port: int
    process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://:{PASSWORD}@127.0.0.1:{self.port}/0"

    def start(self) -> None:
        binary = shutil.which("redis-server")
        if binary is None:
            pytest.skip(
                "no redis-server on PATH: run scripts/setup.sh --dev (as root) or install it"
            )
        self.process = subprocess.Popen(
            [
                binary,
                "--port",
                str(self.port),
                "--bind",
                "127.0.0.1",
                "--requirepass",
                PASSWORD,
                "--save",
                "",
                "--appendonly",
                "no",
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=0.2) as s:
                    s.sendall(f"AUTH {PASSWORD}\r\nPING\r\n".encode())
                    seen = b""
                    while b"PONG" not in seen and (chunk := s.recv(64)):
                        seen += chunk
                    if b"PONG" in seen:
                        return
            except OSError:
                time.sleep(0.05)
        raise RuntimeError(f"redis-server did not answer on port {self.port}")

    def stop(self) -> None:
        if self.process is not None:
            self.process.terminate()
            self.process.wait(timeout=10)
            self.process = None


@contextmanager
def redis_server() -> Iterator[RedisServer]:
    server = RedisServer(free_port())
    server.start()
    try:
        yield server
    finally:
        server.stop()
