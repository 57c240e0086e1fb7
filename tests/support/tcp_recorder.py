"""A TCP relay that records what each connection's client sent first.

Put in front of a server, it shows whether a client ever spoke plain HTTP
(first byte ``P`` of ``POST``, ``G`` of ``GET``) or only TLS (a handshake
record starts with ``0x16``). It runs its own event loop in a thread.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading

from hybrid_llm.local.servers import free_port

TLS_HANDSHAKE = 0x16


class RecordingRelay:
    def __init__(self, target_port: int) -> None:
        self.target_port = target_port
        self.port = free_port()
        self.first_bytes: list[bytes] = []
        self._loop = asyncio.new_event_loop()
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._server: asyncio.Server | None = None

    def __enter__(self) -> RecordingRelay:
        self._thread.start()
        if not self._ready.wait(10):
            raise RuntimeError("relay did not start")
        return self

    def __exit__(self, *exc: object) -> None:
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=10)

    def _run(self) -> None:
        asyncio.set_event_loop(self._loop)
        self._server = self._loop.run_until_complete(
            asyncio.start_server(self._handle, "127.0.0.1", self.port)
        )
        self._ready.set()
        self._loop.run_forever()
        self._server.close()
        with contextlib.suppress(Exception):
            self._loop.run_until_complete(self._server.wait_closed())
        self._loop.close()

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            first = await reader.read(16)
            self.first_bytes.append(first)
            up_reader, up_writer = await asyncio.open_connection("127.0.0.1", self.target_port)
            up_writer.write(first)
            await asyncio.gather(_pipe(reader, up_writer), _pipe(up_reader, writer))
        except OSError:
            pass
        finally:
            writer.close()

    def all_tls(self) -> bool:
        return bool(self.first_bytes) and all(b and b[0] == TLS_HANDSHAKE for b in self.first_bytes)


async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        while data := await reader.read(65536):
            writer.write(data)
            await writer.drain()
    except OSError:
        pass
    finally:
        with contextlib.suppress(OSError):
            writer.close()
