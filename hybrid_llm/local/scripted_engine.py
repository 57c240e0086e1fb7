"""A scripted engine: the engine protocol without a model, for HTTP-layer tests
and the engine replica double (:mod:`hybrid_llm.local.engine_double`).

It answers ``Hello from the double`` at once; the prompt's first word
changes the script:

- ``HOLD``: wait for :attr:`ScriptedEngine.release` before the first token;
- ``BREAK``: fail after two tokens (an engine dying mid-answer);
- ``COUNT``: stream ``max_tokens`` tokens, ``pace_s`` apart (a request that
  runs as long as the test likes, until its client goes away).

``fail_next = N`` fails the next N generations before their first token;
``refuse_next = N`` refuses them (429 ``queue_full``) with
``refuse_retry_after`` as their ``Retry-After``.
With ``context_window`` a prompt is counted in words and held to the window
by the same rules as the llama.cpp engines (:func:`completion_budget`), so
the serving layer's 400 for a prompt that does not fit can be tested.
With ``hold_start`` set, :meth:`start` waits for it (a model still loading);
like the real engines it refuses work (503) until started and once closed.
Every request is recorded, in arrival order.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Literal

from servekit.engine.prompting import completion_budget
from servekit.engine.protocol import (
    Finish,
    GenerationEvent,
    GenerationRequest,
    LoadReport,
    TextDelta,
)
from servekit.errors import EngineFailure, NotReady, QueueFull

__all__ = ["TOKENS", "ScriptedEngine"]

TOKENS = ("Hello", " from", " the", " double")


class ScriptedEngine:
    def __init__(
        self,
        model: str,
        *,
        capacity: int = 64,
        version: str = "",
        context_window: int | None = None,
        pace_s: float = 0.01,
        hold_start: asyncio.Event | None = None,
    ) -> None:
        self.model_name = model
        self.capacity = capacity
        self.version = version
        self.context_window = context_window
        self.pace_s = pace_s
        self.hold_start = hold_start
        self.arrivals: list[str] = []
        self.requests: list[GenerationRequest] = []
        self.fail_next = 0
        self.refuse_next = 0
        self.refuse_retry_after: float | None = None
        self.release = asyncio.Event()
        self.running = 0
        self.prefill_backlog_ms: float | None = None  # what load() reports
        self.prefill_tokens_per_s: float | None = None  # and this
        self.slot_releases: tuple[float, ...] | None = None  # what slot_release_ms() says
        self.started = False
        self.closed = False

    async def start(self) -> None:
        if self.hold_start is not None:
            await self.hold_start.wait()
        self.started = True

    async def ready(self) -> bool:
        return self.started and not self.closed

    async def aclose(self) -> None:
        self.closed = True

    def load(self) -> LoadReport:
        return LoadReport(
            ready=self.started and not self.closed,
            model=self.model_name,
            version=self.version,
            capacity=self.capacity,
            running=self.running,
            max_context_tokens=self.context_window,
            prefill_backlog_ms=self.prefill_backlog_ms,
            prefill_tokens_per_s=self.prefill_tokens_per_s,
        )

    def slot_release_ms(self) -> tuple[float, ...] | None:
        """When its running sequences free their slots, as a batching engine tells."""
        return self.slot_releases

    def generate(self, request: GenerationRequest) -> AsyncIterator[GenerationEvent]:
        return self._generate(request)

    async def _generate(self, request: GenerationRequest) -> AsyncIterator[GenerationEvent]:
        if not self.started or self.closed:
            raise NotReady("model is not loaded", retry_after=1)  # as the real engines do
        text = request.messages[-1].content if request.messages else (request.prompt or "")
        self.arrivals.append(text)
        self.requests.append(request)
        prompt_tokens = sum(len(m.content.split()) for m in request.messages or ()) or len(
            text.split()
        )
        limit = request.sampling.max_tokens
        if self.context_window is not None:
            limit = completion_budget(prompt_tokens, limit, self.context_window)
        if self.fail_next > 0:
            self.fail_next -= 1
            raise EngineFailure("scripted failure")
        if self.refuse_next > 0:
            self.refuse_next -= 1
            raise QueueFull("scripted refusal", retry_after=self.refuse_retry_after)
        self.running += 1
        try:
            if text.startswith("HOLD"):
                await self.release.wait()
            if text.startswith("BREAK"):
                # Die mid-answer, after the first two tokens went out.
                yield TextDelta(TOKENS[0], 1)
                yield TextDelta(TOKENS[1], 1)
                raise EngineFailure("scripted crash mid-answer")
            if text.startswith("COUNT"):
                count = limit or 16
                for i in range(count):
                    yield TextDelta(f" {i}", 1)
                    await asyncio.sleep(self.pace_s)
                yield Finish("length", prompt_tokens=prompt_tokens, completion_tokens=count)
                return
            tokens = TOKENS[:limit] if limit is not None else TOKENS
            for token in tokens:
                yield TextDelta(token, 1)
            finish: Literal["stop", "length"] = "stop" if len(tokens) == len(TOKENS) else "length"
            yield Finish(finish, prompt_tokens=prompt_tokens, completion_tokens=len(tokens))
        finally:
            self.running -= 1
