"""An in-process llama.cpp engine that serves many streams at once (continuous batching).

One model, ``slots`` sequences in one context, one worker thread
(:mod:`servekit.engine.batching_sched`) that decodes every running sequence in
one ``llama_decode`` per step, prefills new prompts in bounded chunks between
decode steps, and reuses a slot's cached prompt prefix. Prompts, templates,
detokenization and stop sequences are the single-sequence engine's, so at
temperature 0 both engines give the same answers; batching changes speed only.

The event loop calls llama.cpp only to tokenize: ``generate`` prepares the
prompt (template and tokens: reading the vocabulary, no compute threads), hands
a job to the worker and reads events from an asyncio queue the worker fills
with ``loop.call_soon_threadsafe``. Tokenizing there is what lets admission
price a request exactly (:meth:`BatchingLlamaEngine.uncached_tokens`).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Callable
from typing import Any

from servekit.engine.batching_jobs import Job, Prepared
from servekit.engine.batching_llama import LlamaBatchModel
from servekit.engine.batching_sched import Scheduler
from servekit.engine.batching_settings import BatchingSettings
from servekit.engine.batching_stats import BatchingSnapshot, BatchingStats
from servekit.engine.prompt_estimate import PromptEstimator, request_blocks, request_text
from servekit.engine.prompting import (
    ChatTemplate,
    completion_budget,
    nonempty,
    tokenize_request,
)
from servekit.engine.protocol import (
    Finish,
    GenerationEvent,
    GenerationRequest,
    LoadReport,
    Message,
    SamplingParams,
)
from servekit.engine.slot_release import left_after_step, read_by_step, release_ms
from servekit.errors import NotReady

__all__ = ["BatchingLlamaEngine", "BatchingSettings"]


class BatchingLlamaEngine:
    """The :class:`~servekit.engine.protocol.Engine` over a batching llama.cpp context."""

    def __init__(self, settings: BatchingSettings, *, version: str = "") -> None:
        self._settings = settings
        self.version = version
        self._scheduler: Scheduler | None = None
        self._stats = BatchingStats(slots=settings.slots)
        self._estimator = PromptEstimator(settings.slots, settings.prefix_report_block_chars)
        self._last_prepared: tuple[GenerationRequest, Prepared | None] | None = None
        self._start_lock = asyncio.Lock()
        self._ready = False
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
            scheduler = Scheduler(
                self._load,
                chunk_tokens=s.chunk_tokens,
                stats=self._stats,
                estimator=self._estimator,
                seed=s.seed,
                shortest_first=s.prefill_order == "shortest",
            )
            await asyncio.wrap_future(scheduler.start())
            self._scheduler = scheduler
            if s.warmup_tokens > 0:
                # The first decodes allocate compute buffers; then one chunk of
                # prompt, so the prefill rate is measured before the first burst
                # (admission prices a backlog of prompts at that rate).
                chunk = " ".join(["hello"] * min(s.chunk_tokens, s.ctx_per_slot // 2))
                warm = (("warmup", "Hello", s.warmup_tokens), ("warmup-prefill", chunk, 1))
                for request_id, text, tokens in warm:
                    request = GenerationRequest(
                        request_id,
                        SamplingParams(max_tokens=tokens, temperature=0.0),
                        messages=(Message("user", text),),
                    )
                    async for _ in self.generate(request):
                        pass
            self._ready = True

    def _load(self) -> tuple[LlamaBatchModel, Callable[[GenerationRequest], Prepared]]:
        """On the worker: load the model and make the request preparer."""
        s = self._settings
        model = LlamaBatchModel(
            s.model_path,
            n_slots=s.slots,
            ctx_per_slot=s.ctx_per_slot,
            n_batch=s.n_batch,
            n_threads=s.n_threads,
        )
        source = s.chat_template or model.metadata("tokenizer.chat_template")
        meta = {"tokenizer.chat_template": source} if source else {}
        template = ChatTemplate.from_metadata(
            meta, model.special_text("bos"), model.special_text("eos")
        )
        return model, lambda request: self._prepare(model, template, request)

    def _prepare(
        self, model: LlamaBatchModel, template: ChatTemplate, request: GenerationRequest
    ) -> Prepared:
        """On the worker: prompt tokens and completion budget, or a 400."""
        tokens = nonempty(tokenize_request(request, template, model, model.add_bos()), model.bos)
        s = self._settings
        limit = completion_budget(
            len(tokens), request.sampling.max_tokens, s.ctx_per_slot, s.default_max_tokens
        )
        return Prepared(tokens, limit)

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

        text = request_text(request)
        blocks = request_blocks(request, self._settings.prefix_report_block_chars)
        prepared = self._prepared(scheduler, request)
        salt = request.cache_salt
        estimate = 0 if prepared is None else scheduler.uncached(prepared.tokens, salt)
        job = Job(request, emit, text=text, blocks=blocks, prepared=prepared, estimate=estimate)
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

    def prefill_backlog_ahead_ms(self, tokens: int) -> float | None:
        """The prefill a request of ``tokens`` uncached prompt tokens would wait
        behind, at the measured rate (see :func:`prefill_backlog_ms`)."""
        stats = self._stats
        rate = stats.prefill_rate()
        remaining = stats.prefill_remaining  # one tuple, replaced whole by the worker
        in_flight = stats.step_in_flight
        running, rest_of_step = None, 0.0
        if remaining:
            if in_flight is not None and rate:
                # It cannot join the step being read: it waits for that to end.
                began, reading = in_flight
                rest_of_step = max(0.0, reading / rate - (time.monotonic() - began)) * 1000.0
                remaining = left_after_step(remaining, reading)
            # Shortest first: the prompts with no more left than its own go first,
            # and the call that reads its last token also reads the prompts that step ends.
            first = tokens + sum(r for r in remaining if r <= tokens)
            order = sorted((*remaining, tokens))
            running = read_by_step(first, order, self._settings.chunk_tokens) - tokens
        ahead = backlog_ms(
            stats.prefill_backlog_tokens if running is None else running,
            self._pending_tokens(),
            rate,
        )
        return None if ahead is None else ahead + rest_of_step

    def slot_release_ms(self) -> tuple[float, ...] | None:
        """Milliseconds until each running sequence frees its slot, ascending, from
        what each has left (:mod:`servekit.engine.slot_release`)."""
        return self._release_ms(self._stats.slot_work)  # replaced whole by the worker

    def slot_hold_ms(self, tokens: int, max_tokens: int | None) -> float | None:
        """How long a request with ``tokens`` prompt tokens to prefill and an answer
        of at most ``max_tokens`` would hold a slot it took now, beside the running
        sequences (:mod:`servekit.engine.slot_release`): what admission expects of a
        request it let in before the worker has placed it (``servekit.admission``)."""
        newcomer = (tokens, max_tokens or self._settings.ctx_per_slot, max_tokens is None)
        each = self._release_ms((*self._stats.slot_work, newcomer), in_order=True)
        return None if each is None else each[-1]

    def _release_ms(
        self, work: tuple[tuple[int, int, bool], ...], *, in_order: bool = False
    ) -> tuple[float, ...] | None:
        stats = self._stats
        return release_ms(
            work,
            prefill_tokens_per_s=stats.prefill_rate(),
            # A wait is predicted only when admission holds every slot, and the
            # worker places those within a step: every slot decodes. Priced for the
            # few running at the moment, a slot predicted to free in 1.1 s took 2.5.
            decode_step_s=stats.decode_step(self.capacity),
            chunk_tokens=self._settings.chunk_tokens,
            typical_tokens=stats.typical_completion(),
            shortest_first=self._settings.prefill_order == "shortest",
            in_order=in_order,
        )

    def uncached_tokens(self, request: GenerationRequest) -> int | None:
        """Prompt tokens of ``request`` no slot of its cache scope holds, counted on
        its real tokens (:meth:`Scheduler.uncached`); ``None`` before the model is
        loaded or for a prompt the engine will refuse anyway.

        Guessed from characters, the price missed a chat template's own tokens
        and text that tokenizes densely (SmolLM2 reads each digit as a token):
        under 32 streams of overload a quarter of the prompts were placed with
        20-215 tokens more to prefill than priced (a 261-token question priced
        at 46 took 3.4 s to its first token against a 1.5 s budget)."""
        scheduler = self._scheduler
        if scheduler is None:
            return None
        prepared = self._prepared(scheduler, request)
        return None if prepared is None else scheduler.uncached(prepared.tokens, request.cache_salt)

    def _prepared(self, scheduler: Scheduler, request: GenerationRequest) -> Prepared | None:
        """The request's prompt tokens and budget, made once: admission prices a
        request and hands it to ``generate`` next (tokenizing a 1,300-token prompt
        takes 3 ms of the event loop here); ``None`` before the model is loaded or
        when it cannot be prepared (the worker then fails it with the reason)."""
        last = self._last_prepared
        if last is not None and last[0] is request:
            return last[1]
        prepared = None
        if scheduler.prepare is not None:
            with contextlib.suppress(Exception):  # a bad prompt fails on the worker
                prepared = scheduler.prepare(request)
        self._last_prepared = (request, prepared)
        return prepared

    def stats(self) -> BatchingSnapshot:
        """Scheduler figures for metrics: slots, running/waiting, batch sizes, rates."""
        return self._stats.snapshot()

    def _pending_tokens(self) -> int:
        scheduler = self._scheduler
        return 0 if scheduler is None else scheduler.pending_tokens()

    def decode_step_seconds(self, sequences: int) -> list[float]:
        """How long recent decode-only steps of ``sequences`` sequences took (TPOT)."""
        return self._stats.decode_step_seconds(sequences)

    def load(self) -> LoadReport:
        snap = self._stats.snapshot()
        return LoadReport(
            ready=self._ready and not self._closed,
            waiting=snap.waiting,
            running=snap.running,
            capacity=self.capacity,
            ttft_p50_ms=snap.ttft_p50_ms,
            ttft_p95_ms=snap.ttft_p95_ms,
            busy_ms_per_seq=snap.busy_ms_per_seq,
            prefill_backlog_ms=prefill_backlog_ms(snap, self._pending_tokens()),
            max_context_tokens=self._settings.ctx_per_slot,
            decode_tokens_per_s=snap.decode_tokens_per_s,
            prefill_tokens_per_s=snap.prefill_tokens_per_s,
            model=self.model_name,
            version=self.version,
            requests_ok=snap.requests_ok,
            requests_failed=snap.requests_failed,
            prefix_cache_query_tokens=snap.prompt_tokens,
            prefix_cache_hit_tokens=snap.reused_prompt_tokens,
            **self._held_prefixes(),
        )

    def _held_prefixes(self) -> dict[str, Any]:
        chars = self._settings.prefix_report_block_chars
        if not chars:
            return {}
        held = self._estimator.held_blocks(self._settings.prefix_report_stride)
        return {"prefix_blocks": held, "prefix_block_chars": chars}

    async def ready(self) -> bool:
        return self._ready and not self._closed

    async def aclose(self) -> None:
        self._closed = True
        self._ready = False
        scheduler, self._scheduler = self._scheduler, None
        if scheduler is not None:  # the worker frees the model on its way out
            await asyncio.to_thread(scheduler.stop)


def prefill_backlog_ms(snap: BatchingSnapshot, pending_tokens: int) -> float | None:
    """The prompt tokens still to prefill, at the measured rate: the running
    sequences' exactly, and the ``pending_tokens`` estimated for the jobs the
    worker has not taken in yet (it tokenizes a job when its step ends, and a
    burst that arrives meanwhile would each see none ahead;
    :mod:`servekit.engine.prompt_estimate`)."""
    return backlog_ms(snap.prefill_backlog_tokens, pending_tokens, snap.prefill_tokens_per_s)


def backlog_ms(running: int, pending_tokens: int, rate: float | None) -> float | None:
    """``running`` + ``pending_tokens`` prompt tokens at ``rate`` tokens/s (None: no
    rate measured yet). :meth:`BatchingLlamaEngine.prefill_backlog_ahead_ms` passes
    only the running prompts that go before a newcomer (shortest first: those
    with no more tokens left); jobs not taken in yet count whole, their sizes
    are not known apart."""
    tokens = float(running + pending_tokens)
    if not tokens:
        return 0.0
    return tokens / rate * 1000.0 if rate else None
