"""An in-process llama.cpp engine that serves many streams at once (continuous batching).

One model, ``slots`` sequences in one context, one worker thread
(:mod:`servekit.engine.batching_sched`) that decodes every running sequence in
one ``llama_decode`` per step, prefills new prompts in bounded chunks between
decode steps, and reuses a slot's cached prompt prefix. Prompts, templates,
detokenization and stop sequences are the single-sequence engine's, so at
temperature 0 both engines give the same answers; batching changes speed only.

The event loop never calls llama.cpp: ``generate`` hands a job to the worker
and reads events from an asyncio queue the worker fills with
``loop.call_soon_threadsafe``.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
from collections.abc import AsyncIterator
from pathlib import Path

from pydantic import BaseModel, Field, model_validator

from servekit.engine.batching_llama import LlamaBatchModel
from servekit.engine.batching_prompt import PromptMaker
from servekit.engine.batching_sched import Job, Prepared, Scheduler
from servekit.engine.batching_stats import BatchingSnapshot, BatchingStats
from servekit.engine.protocol import (
    Finish,
    GenerationEvent,
    GenerationRequest,
    LoadReport,
    SamplingParams,
)
from servekit.errors import ContextLengthExceeded, NotReady

__all__ = ["BatchingLlamaEngine", "BatchingSettings"]


class BatchingSettings(BaseModel):
    """Settings of the batching llama.cpp engine (``engine: llama-batching``)."""

    model_path: Path = Field(description="The GGUF file to load.")
    model_name: str = Field(min_length=1, description="The name clients use for the model.")
    version: str = Field("", description="The model version reported in load reports.")
    slots: int = Field(4, ge=1, le=64, description="Sequences decoded together (n_seq_max).")
    ctx_per_slot: int = Field(
        2048, ge=64, description="KV cache per slot: prompt plus completion must fit."
    )
    chunk_tokens: int = Field(
        128,
        ge=1,
        description="Prompt tokens prefilled per step, interleaved with decoding; "
        "smaller keeps running streams smoother, larger gives faster first tokens.",
    )
    n_threads: int = Field(2, ge=1, description="CPU threads for llama.cpp.")

    @model_validator(mode="after")
    def _chunk_fits(self) -> BatchingSettings:
        if self.chunk_tokens >= self.ctx_per_slot:
            raise ValueError("chunk_tokens must be smaller than ctx_per_slot")
        return self

    @property
    def n_batch(self) -> int:
        """Largest batch one step can build: one token per slot plus a prefill chunk."""
        return self.slots + self.chunk_tokens


class BatchingLlamaEngine:
    """The :class:`~servekit.engine.protocol.Engine` over a batching llama.cpp context."""

    def __init__(self, settings: BatchingSettings) -> None:
        self._settings = settings
        self._model: LlamaBatchModel | None = None
        self._scheduler: Scheduler | None = None
        self._stats = BatchingStats(slots=settings.slots)
        self._start_lock = asyncio.Lock()
        self._ids = itertools.count()
        self._closed = False

    @property
    def model_name(self) -> str:
        return self._settings.model_name

    @property
    def capacity(self) -> int:
        return self._settings.slots

    @property
    def settings(self) -> BatchingSettings:
        return self._settings

    async def start(self) -> None:
        async with self._start_lock:
            if self._scheduler is not None:
                return
            if self._closed:
                raise NotReady("engine is closed")
            s = self._settings
            model = await asyncio.to_thread(
                LlamaBatchModel,
                s.model_path,
                n_slots=s.slots,
                ctx_per_slot=s.ctx_per_slot,
                n_batch=s.n_batch,
                n_threads=s.n_threads,
            )
            prompts = PromptMaker(model)
            scheduler = Scheduler(
                model,
                lambda request: self._prepare(prompts, request),
                chunk_tokens=s.chunk_tokens,
                stats=self._stats,
            )
            scheduler.start()
            self._model, self._scheduler = model, scheduler
            # Warm up: the first decode allocates compute buffers.
            async for _ in self.generate(
                GenerationRequest(
                    "warmup", SamplingParams(max_tokens=1, temperature=0.0), prompt="Hi"
                )
            ):
                pass

    def _prepare(self, prompts: PromptMaker, request: GenerationRequest) -> Prepared:
        """On the worker: prompt tokens, token budget and detokenizer, or a 400."""
        tokens = prompts.tokens(request)
        limit = self._settings.ctx_per_slot
        wanted = request.sampling.max_tokens
        room = limit - len(tokens)
        if room < 1 or (wanted is not None and wanted > room):
            need = len(tokens) + (wanted or 1)
            raise ContextLengthExceeded(
                f"This model's context per sequence is {limit} tokens; the request needs "
                f"{need} ({len(tokens)} in the prompt, {wanted or 1} for the completion).",
                param="messages" if request.messages is not None else "prompt",
            )
        return Prepared(tokens, wanted or room, prompts.text_stream(request))

    async def generate(self, request: GenerationRequest) -> AsyncIterator[GenerationEvent]:
        scheduler = self._scheduler
        if scheduler is None or self._closed:
            raise NotReady("model is not loaded")
        loop = asyncio.get_running_loop()
        events: asyncio.Queue[GenerationEvent | BaseException] = asyncio.Queue()

        def emit(item: GenerationEvent | BaseException) -> None:
            # RuntimeError: the loop is closed, so nobody is listening any more.
            with contextlib.suppress(RuntimeError):
                loop.call_soon_threadsafe(events.put_nowait, item)

        job = Job(request, emit)
        scheduler.submit(job)
        done = False
        try:
            while True:
                item = await events.get()
                if isinstance(item, BaseException):
                    done = True
                    raise item
                if isinstance(item, Finish):
                    done = True
                    yield item
                    return
                yield item
        finally:
            if not done:
                scheduler.cancel(job)

    def stats(self) -> BatchingSnapshot:
        """Scheduler figures for metrics: slots, running/waiting, batch sizes, rates."""
        return self._stats.snapshot()

    def load(self) -> LoadReport:
        snap = self._stats.snapshot()
        return LoadReport(
            ready=self._scheduler is not None and not self._closed,
            waiting=snap.waiting,
            running=snap.running,
            capacity=self.capacity,
            ttft_p50_ms=snap.ttft_p50_ms,
            ttft_p95_ms=snap.ttft_p95_ms,
            decode_tokens_per_s=snap.decode_tokens_per_s,
            prefill_tokens_per_s=snap.prefill_tokens_per_s,
            model=self.model_name,
            version=self._settings.version,
            requests_ok=snap.requests_ok,
            requests_failed=snap.requests_failed,
        )

    async def ready(self) -> bool:
        return self._scheduler is not None and not self._closed

    async def aclose(self) -> None:
        self._closed = True
        scheduler, model = self._scheduler, self._model
        self._scheduler = self._model = None
        if scheduler is not None:
            await asyncio.to_thread(scheduler.stop)
        if model is not None:
            await asyncio.to_thread(model.close)
