"""In-process llama.cpp engine (llama-cpp-python), one sequence at a time.

All model calls run on one dedicated worker thread; the event loop only
awaits. Generated tokens cross back through ``call_soon_threadsafe`` into a
per-request queue. Closing the async iterator (client gone) raises a flag
the worker checks after every token, so the engine is free within one token.

Prompt prefixes are reused two ways: ``Llama.generate`` keeps the common
prefix with the previous request's context, and :class:`PrefixStateCache`
restores saved context states of earlier, different prompts. Both only
within the request's cache scope (its ``cache_salt``): a context another
scope left is reset first.
"""

from __future__ import annotations

import asyncio
import dataclasses
import os
import random
import threading
import time
from collections.abc import AsyncIterator, Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel, ConfigDict, Field

from servekit.engine.prefix_cache import (
    PrefixStateCache,
    common_prefix,
    read_context_state,
    write_context_state,
)
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
    TextDelta,
)
from servekit.engine.rates import RateTracker
from servekit.engine.textstream import TextStream
from servekit.errors import (
    EngineFailure,
    NotReady,
    ServeError,
)

if TYPE_CHECKING:  # llama_cpp is imported only when a model loads
    from servekit.engine.llama_vocab import LlamaVocab

__all__ = [
    "LlamaCppEngine",
    "LlamaSettings",
    "PrefixCacheSettings",
    "PromptLookupSettings",
    "RateTracker",
]


class PrefixCacheSettings(BaseModel):
    model_config = ConfigDict(extra="forbid")
    enabled: bool = Field(True, description="Keep context states of earlier prompts.")
    capacity_mb: int = Field(256, ge=1, description="Byte budget of saved states.")
    min_tokens: int = Field(32, ge=1, description="Shorter prompts are not worth saving.")


class PromptLookupSettings(BaseModel):
    model_config = ConfigDict(extra="forbid")
    enabled: bool = Field(False, description="Prompt-lookup speculative decoding.")
    num_pred_tokens: int = Field(10, ge=1, le=64)
    max_ngram_size: int = Field(2, ge=1, le=8)


class LlamaSettings(BaseModel):
    """Settings of the in-process llama.cpp engine."""

    model_config = ConfigDict(extra="forbid", protected_namespaces=())
    model_path: Path = Field(description="GGUF file to load.")
    model_name: str = Field(description="Name clients address the model by.")
    n_ctx: int = Field(4096, ge=64, description="Context window in tokens.")
    n_threads: int | None = Field(None, ge=1, description="CPU threads; default all cores.")
    n_batch: int = Field(512, ge=1, description="Prompt tokens per llama_decode call.")
    seed: int | None = Field(None, description="Default sampling seed.")
    warmup_tokens: int = Field(4, ge=0, description="Tokens generated before ready.")
    default_max_tokens: int | None = Field(
        None, ge=1, description="Cap when a request sets no max_tokens (default: the context)."
    )
    chat_template: str | None = Field(None, description="Override the GGUF's chat template.")
    prefix_cache: PrefixCacheSettings = PrefixCacheSettings()
    prompt_lookup: PromptLookupSettings = PromptLookupSettings()


_Emit = Callable[[GenerationEvent | BaseException], None]


class LlamaCppEngine:
    """The single-sequence in-process engine; ``capacity`` is 1."""

    def __init__(self, settings: LlamaSettings, *, version: str = "") -> None:
        self.settings = settings
        self.version = version
        self._worker = ThreadPoolExecutor(max_workers=1, thread_name_prefix="llama")
        self._llama: Any = None
        self._lib: Any = None
        self._vocab: LlamaVocab | None = None
        self._template: ChatTemplate | None = None
        self._ready = False
        self._closed = False
        self._start_lock = asyncio.Lock()
        self._running = 0
        self._rates = RateTracker()
        self._cache = (
            PrefixStateCache(
                settings.prefix_cache.capacity_mb << 20, settings.prefix_cache.min_tokens
            )
            if settings.prefix_cache.enabled
            else None
        )
        self._counters = {"query": 0, "hit": 0, "draft": 0, "accepted": 0, "draft_calls": 0}
        self._live_salt: str | None = None  # the cache scope of what the context holds

    # ------------------------------------------------------------ lifecycle

    @property
    def model_name(self) -> str:
        return self.settings.model_name

    @property
    def capacity(self) -> int:
        return 1

    @property
    def n_ctx(self) -> int:
        return self.settings.n_ctx

    async def start(self) -> None:
        async with self._start_lock:
            if self._ready:
                return
            loop = asyncio.get_running_loop()
            await loop.run_in_executor(self._worker, self._load)
            if self.settings.warmup_tokens > 0:
                await self._warm_up()
            self._ready = True

    def _load(self) -> None:
        try:
            from servekit.engine.llama_lib import llama_cpp
        except ImportError as exc:  # pragma: no cover - depends on the install
            raise EngineFailure(f"llama-cpp-python is not installed: {exc}") from None
        s = self.settings
        if not s.model_path.is_file():
            raise EngineFailure(f"model file not found: {s.model_path}")
        draft = None
        if s.prompt_lookup.enabled:
            from llama_cpp.llama_speculative import LlamaPromptLookupDecoding

            counters = self._counters

            class CountingDraft(LlamaPromptLookupDecoding):
                """Prompt lookup that counts what it proposes, for the metrics."""

                def __call__(self, input_ids: Any, /, **kwargs: Any) -> Any:
                    drafted = super().__call__(input_ids, **kwargs)
                    counters["draft"] += len(drafted)
                    counters["draft_calls"] += 1
                    return drafted

            draft = CountingDraft(
                max_ngram_size=s.prompt_lookup.max_ngram_size,
                num_pred_tokens=s.prompt_lookup.num_pred_tokens,
            )
        try:
            self._llama = llama_cpp.Llama(
                model_path=str(s.model_path),
                n_ctx=s.n_ctx,
                n_batch=min(s.n_batch, s.n_ctx),
                n_threads=s.n_threads or os.cpu_count() or 1,
                n_threads_batch=s.n_threads or os.cpu_count() or 1,
                draft_model=draft,
                verbose=False,
            )
        except (ValueError, RuntimeError, OSError) as exc:
            raise EngineFailure(f"llama.cpp could not load {s.model_path}: {exc}") from None
        self._lib = llama_cpp
        from servekit.engine.llama_vocab import LlamaVocab

        self._vocab = LlamaVocab(llama_cpp.llama_model_get_vocab(self._llama.model))
        meta = dict(self._llama.metadata)
        if s.chat_template:
            meta["tokenizer.chat_template"] = s.chat_template
        self._template = ChatTemplate.from_metadata(
            meta, self._vocab.special_text("bos"), self._vocab.special_text("eos")
        )

    async def _warm_up(self) -> None:
        from servekit.engine.protocol import Message, SamplingParams

        req = GenerationRequest(
            request_id="warmup",
            sampling=SamplingParams(max_tokens=self.settings.warmup_tokens, temperature=0.0),
            messages=(Message("user", "Hello"),),
        )
        async for _ in self._generate(req, warm=True):
            pass

    async def ready(self) -> bool:
        return self._ready and not self._closed

    async def aclose(self) -> None:
        if self._closed:
            return
        self._closed = True
        self._ready = False
        loop = asyncio.get_running_loop()
        await loop.run_in_executor(self._worker, self._unload)
        self._worker.shutdown(wait=True)

    def _unload(self) -> None:
        if self._llama is not None:
            self._llama.close()
            self._llama = None

    def load(self) -> LoadReport:
        c = self._counters
        return dataclasses.replace(
            self._rates.report(),
            ready=self._ready,
            running=self._running,
            capacity=1,
            max_context_tokens=self.settings.n_ctx,
            model=self.model_name,
            version=self.version,
            prefix_cache_query_tokens=c["query"],
            prefix_cache_hit_tokens=c["hit"],
            spec_draft_tokens=c["draft"],
            spec_accepted_tokens=c["accepted"],
        )

    # ------------------------------------------------------------ generation

    def generate(self, request: GenerationRequest) -> AsyncIterator[GenerationEvent]:
        return self._generate(request)

    async def tokenize(self, request: GenerationRequest) -> list[int]:
        """Prompt tokens for ``request`` (chat template applied), off the event loop."""
        if self._vocab is None or self._template is None:
            raise NotReady("model is still loading", retry_after=1)
        vocab, template = self._vocab, self._template
        size = len(request.prompt or "") + sum(len(m.content) for m in request.messages or ())
        if size < 4096:  # microseconds of work: not worth a thread hop on the TTFT path
            tokens = tokenize_request(request, template, vocab, vocab.add_bos())
        else:
            tokens = await asyncio.to_thread(
                tokenize_request, request, template, vocab, vocab.add_bos()
            )
        return nonempty(tokens, vocab.bos)

    async def _generate(
        self, request: GenerationRequest, warm: bool = False
    ) -> AsyncIterator[GenerationEvent]:
        if self._closed or (not self._ready and not warm):
            raise NotReady("model is not loaded", retry_after=1)
        tokens = await self.tokenize(request)
        limit = self._check_context(len(tokens), request.sampling.max_tokens)
        loop = asyncio.get_running_loop()
        queue: asyncio.Queue[GenerationEvent | BaseException] = asyncio.Queue()
        cancel = threading.Event()

        def emit(item: GenerationEvent | BaseException) -> None:
            loop.call_soon_threadsafe(queue.put_nowait, item)

        job = loop.run_in_executor(
            self._worker, self._run, request, tokens, limit, emit, cancel, warm
        )
        try:
            while True:
                item = await queue.get()
                if isinstance(item, BaseException):
                    raise item
                yield item
                if isinstance(item, Finish):
                    break
        finally:
            cancel.set()
            if not job.done():
                # Let the worker notice the flag; do not wait for it.
                job.add_done_callback(_consume_exception)

    def _check_context(self, prompt_tokens: int, max_tokens: int | None) -> int:
        s = self.settings
        return completion_budget(prompt_tokens, max_tokens, s.n_ctx, s.default_max_tokens)

    def _run(
        self,
        request: GenerationRequest,
        tokens: list[int],
        limit: int,
        emit: _Emit,
        cancel: threading.Event,
        warm: bool = False,
    ) -> None:
        if cancel.is_set():
            return
        self._running = 1
        try:
            # Warm-up runs while the whole node starts: its speeds mislead routers.
            rates = RateTracker() if warm else self._rates
            self._run_inner(request, tokens, limit, emit, cancel, rates)
        except ServeError as exc:
            emit(exc)
        except Exception as exc:  # the one boundary for llama.cpp failures
            emit(EngineFailure(f"generation failed: {type(exc).__name__}: {exc}"))
        finally:
            self._running = 0

    def _restore_prefix(self, tokens: list[int], salt: str | None) -> int:
        """Load the best saved state of scope ``salt`` if it beats what the context
        already holds (nothing, when another scope's prompt is in it)."""
        llama = self._llama
        if salt != self._live_salt:
            llama.reset()  # Llama.generate would reuse any common prefix
            self._live_salt = salt
        live = common_prefix(llama.input_ids[: llama.n_tokens].tolist(), tokens)
        if self._cache is None:
            return live
        entry, cached = self._cache.lookup(tokens, salt)
        if entry is not None and cached > live:
            write_context_state(self._lib, llama._ctx.ctx, entry.data)
            llama.input_ids[: len(entry.tokens)] = entry.tokens
            llama.n_tokens = len(entry.tokens)
            llama._requires_eval = True
            return cached
        return live

    def _save_state(self, tokens: list[int]) -> None:
        """Keep the context's state, which holds exactly ``tokens``, in the prefix cache."""
        assert self._cache is not None
        assert self._llama is not None
        state = read_context_state(self._lib, self._llama._ctx.ctx)
        self._cache.store(tokens, state, self._live_salt)

    def _run_inner(
        self,
        request: GenerationRequest,
        tokens: list[int],
        limit: int,
        emit: _Emit,
        cancel: threading.Event,
        rates: RateTracker,
    ) -> None:
        llama, vocab = self._llama, self._vocab
        assert llama is not None
        assert vocab is not None
        sp = request.sampling
        t0 = time.perf_counter()
        reused = min(self._restore_prefix(tokens, request.cache_salt), len(tokens) - 1)
        self._counters["query"] += len(tokens)
        self._counters["hit"] += reused
        seed = sp.seed if sp.seed is not None else self.settings.seed
        llama.set_seed((seed if seed is not None else random.getrandbits(32)) & 0xFFFFFFFF)
        greedy = sp.greedy
        gen = llama.generate(
            tokens,
            top_k=0,
            top_p=1.0 if greedy else sp.top_p,
            min_p=0.0,
            temp=0.0 if greedy else sp.temperature,
            repeat_penalty=1.0,
            frequency_penalty=sp.frequency_penalty,
            presence_penalty=sp.presence_penalty,
        )
        stream = TextStream(sp.stop)
        calls_before = self._counters["draft_calls"]
        produced = 0
        pending_tokens = 0
        reason = "length"
        t_first = 0.0
        # The context holds exactly the prompt from the first token until the
        # next decode: the state is saved then, but after the first token has
        # been emitted (copying a long prompt's state takes milliseconds).
        save = False
        try:
            for token in gen:
                if produced == 0:
                    t_first = time.perf_counter()
                    rates.ttft(t_first - t0)
                    if len(tokens) - reused >= 16:  # a token or two measures decode, not prefill
                        rates.prefill(len(tokens) - reused, t_first - t0)
                    save = self._cache is not None and len(tokens) - reused >= 16
                if cancel.is_set():
                    return
                if vocab.is_eog(token):
                    reason = "stop"
                    break
                produced += 1
                pending_tokens += 1
                text = stream.push(vocab.piece(token))
                if text:
                    emit(TextDelta(text, pending_tokens))
                    pending_tokens = 0
                if save:
                    self._save_state(tokens)
                    save = False
                if stream.stopped:
                    reason = "stop"
                    break
                if produced >= limit:
                    reason = "length"
                    break
        finally:
            gen.close()
        if save:  # stopped at the first token: the context still holds the prompt
            self._save_state(tokens)
        tail = stream.flush()
        if tail or pending_tokens:
            emit(TextDelta(tail, pending_tokens))
        if produced > 1:
            rates.decode(produced - 1, time.perf_counter() - t_first)
        if self.settings.prompt_lookup.enabled:
            # Each decode step yields one sampled token plus the drafts it accepted.
            steps = self._counters["draft_calls"] - calls_before
            self._counters["accepted"] += max(0, produced - steps)
        emit(Finish(reason, len(tokens), produced, reused))  # type: ignore[arg-type]


def _consume_exception(fut: asyncio.Future[Any]) -> None:
    if not fut.cancelled():
        fut.exception()
