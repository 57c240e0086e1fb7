"""One ``vllm serve`` process's prefix report: its event socket, feed and held prefixes.

The edge's :class:`~servekit.engine.vllm.VllmEngine` and the gateway's vLLM
replicas launch vLLM the same way and report what its cache holds the same
way, through a :class:`VllmPrefixReport`:

- :attr:`argv` goes on the ``vllm serve`` command line: the server publishes
  its KV-cache events on a Unix socket of its own (only this user may connect
  to it; the events carry prompt tokens);
- :meth:`start` subscribes (before the server binds: ZeroMQ connects when it
  can, and again after a restart), :meth:`aclose` stops and removes the socket;
- :meth:`generate` sends a request through it (tagged, its prompt length
  learned: :mod:`servekit.engine.held_prefixes`); :meth:`report` gives the
  load report's ``prefix_blocks``; :meth:`reset` when the server restarted.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import secrets
import tempfile
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

from servekit.engine.held_prefixes import HeldPrefixes
from servekit.engine.kv_events import KvEventFeed, kv_events_argv
from servekit.engine.protocol import (
    Engine,
    Finish,
    GenerationEvent,
    GenerationRequest,
    LoadReport,
)
from servekit.engine.vllm_args import VllmServeArgs

__all__ = ["PrefixReportingEngine", "VllmPrefixReport", "prefix_report_for"]


class VllmPrefixReport:
    """See the module docstring; ``label`` names the socket (a port, a replica name)."""

    def __init__(self, label: str, block_chars: int = 64, stride: int = 4) -> None:
        name = f"vllm-kv-{label}-{secrets.token_hex(4)}.sock"
        self.socket = Path(tempfile.gettempdir()) / name
        self.held = HeldPrefixes(block_chars, stride)
        self.feed = KvEventFeed(f"ipc://{self.socket}", self.held.apply, self.held.reset)
        self._task: asyncio.Task[None] | None = None

    @property
    def argv(self) -> list[str]:
        return kv_events_argv(self.feed.endpoint)

    def start(self) -> None:
        if self._task is None:
            self._task = self.feed.start()

    async def aclose(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
            self._task = None
        self.socket.unlink(missing_ok=True)

    def reset(self) -> None:
        """The server restarted: its cache is empty."""
        self.held.reset()

    async def generate(
        self,
        request: GenerationRequest,
        send: Callable[[GenerationRequest], AsyncIterator[GenerationEvent]],
    ) -> AsyncIterator[GenerationEvent]:
        """``send(request)``'s events, the request tagged and its prompt length noted."""
        tagged = self.held.tag(request)
        events = send(tagged)
        try:
            async for event in events:
                if isinstance(event, Finish):
                    self.held.finished(tagged, event.prompt_tokens)
                yield event
        finally:
            close = getattr(events, "aclose", None)
            if close is not None:
                with contextlib.suppress(Exception):
                    await close()

    def report(self) -> dict[str, Any]:
        return self.held.report()

    def status(self) -> dict[str, int]:
        return {"kv_event_batches": self.feed.batches, "kv_event_gaps": self.feed.gaps}


def prefix_report_for(args: VllmServeArgs, label: str) -> VllmPrefixReport | None:
    """The report a server of ``args`` gives, if it gives one (prefix caching on and
    ``prefix_report_block_chars`` set)."""
    if not args.reports_prefixes:
        return None
    return VllmPrefixReport(label, args.prefix_report_block_chars, args.prefix_report_stride)


class PrefixReportingEngine:
    """An engine whose requests to its vLLM server go through ``prefixes`` (a gateway's
    vLLM replica, reached through the shared OpenAI-HTTP engine); all else is the inner's."""

    def __init__(self, inner: Engine, prefixes: VllmPrefixReport) -> None:
        self.inner = inner
        self.prefixes = prefixes

    @property
    def model_name(self) -> str:
        return self.inner.model_name

    @property
    def capacity(self) -> int:
        return self.inner.capacity

    async def start(self) -> None:
        await self.inner.start()

    def generate(self, request: GenerationRequest) -> AsyncIterator[GenerationEvent]:
        return self.prefixes.generate(request, self.inner.generate)

    def load(self) -> LoadReport:
        return dataclasses.replace(self.inner.load(), **self.prefixes.report())

    async def ready(self) -> bool:
        return await self.inner.ready()

    async def aclose(self) -> None:
        await self.inner.aclose()
