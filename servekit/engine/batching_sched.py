"""The continuous-batching scheduler: one worker thread drives every llama.cpp call.

Each step of the loop:

1. takes new jobs and cancellations from the inbox (never blocking while
   work is running);
2. frees the slots of cancelled sequences (their KV cache is dropped);
3. admits waiting jobs into free slots (``batching_slots.place``), preferring
   the slot whose cached tokens share the longest prefix with the new prompt
   (only the differing tail of that slot's cache is removed; only a slot of
   the request's cache scope counts);
4. builds one batch: the next token of every decoding sequence, then up to
   ``chunk_tokens`` prompt tokens of prefilling sequences (chunked prefill:
   a long prompt is spread over several steps instead of stalling everyone),
   the budget first to the fewest prompt tokens left (``shortest_first``;
   ties, or off, in admission order: first come, first served held short
   questions 5-15 s behind documents admitted just before them);
5. runs one ``llama_decode`` and samples, per sequence, with its own chain;
   text goes to the job's sink (which hands it to the event loop).

A finished sequence leaves its tokens in its slot's cache for prefix reuse;
a cancelled one (client gone) has its cache dropped.
"""

from __future__ import annotations

import heapq
import itertools
import queue
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from dataclasses import dataclass, field

from servekit.engine.batching_llama import BatchItem, LlamaBatchModel
from servekit.engine.batching_sampler import SamplerChain
from servekit.engine.batching_slots import Slot, place, reusable
from servekit.engine.batching_stats import BatchingStats
from servekit.engine.prompt_estimate import PromptEstimator
from servekit.engine.protocol import Finish, GenerationRequest, TextDelta
from servekit.engine.textstream import TextStream
from servekit.errors import EngineFailure, ServeError
from servekit.wire import FinishReason

__all__ = ["Job", "Prepared", "Scheduler"]


@dataclass(slots=True)
class Prepared:
    """A job's prompt tokens and completion budget, made on the worker."""

    tokens: list[int]
    max_new_tokens: int


Emit = Callable[[TextDelta | Finish | BaseException], None]
Prepare = Callable[[GenerationRequest], Prepared]


@dataclass(eq=False)
class Job:
    """A request handed to the scheduler; ``emit`` must be thread-safe. ``text`` is
    its prompt's text (:mod:`servekit.engine.prompt_estimate`), ``prepared`` its
    tokens when the caller made them already (else the worker does), and
    ``estimate`` the uncached tokens it was priced at until it has a slot
    (:meth:`Scheduler.uncached`)."""

    request: GenerationRequest
    emit: Emit
    submitted: float = field(default_factory=time.monotonic)
    cancelled: bool = False
    text: str = ""
    blocks: tuple[int, ...] = ()  # its messages' block names, reported once a slot holds it
    prepared: Prepared | None = None
    estimate: int = 0
    priced: bool = True  # its estimate still counts in the scheduler's pending tokens


@dataclass(eq=False)
class _Seq:
    job: Job
    prompt: list[int]
    max_new: int
    text: TextStream
    sampler: SamplerChain
    slot: Slot[_Seq]
    n_past: int  # tokens of this sequence already in the slot's cache
    cached_prompt: int
    generated: int = 0  # completion tokens (an end-of-generation token is not one)
    unsent: int = 0  # tokens whose text is still held back by the text stream
    said: list[str] = field(default_factory=list)  # the text sent, which its slot keeps
    started: float = 0.0
    others: int = 0  # sequences running in other slots when it got its own
    since: float = 0.0  # when its busy-slowdown sample starts (see _admit)
    next_token: int | None = None  # sampled, not yet in the cache
    out_index: int = -1  # batch index of this sequence's logits in the current step

    @property
    def prefilling(self) -> bool:
        return self.n_past < len(self.prompt)

    @property
    def open_ended(self) -> bool:
        """Its request set no max_tokens: it may run to the end of its slot."""
        return self.job.request.sampling.max_tokens is None


class Scheduler:
    """Owns the worker thread, the slots and the waiting queue."""

    def __init__(
        self,
        load: Callable[[], tuple[LlamaBatchModel, Prepare]],
        *,
        chunk_tokens: int,
        stats: BatchingStats,
        estimator: PromptEstimator,
        seed: int | None = None,
        shortest_first: bool = True,
    ) -> None:
        self._load = load
        self._estimator = estimator
        self._model: LlamaBatchModel
        self._prepare: Prepare | None = None  # set by the worker once loaded
        self._chunk = chunk_tokens
        self._shortest_first = shortest_first
        self._seed = seed
        self.stats = stats
        self._slots: list[Slot[_Seq]] = []
        self._inbox: queue.SimpleQueue[Job | None] = queue.SimpleQueue()
        # The estimated prompt tokens of jobs submitted / settled (admitted to a
        # slot, where the backlog counts them exactly, or dropped), each written
        # by one thread only.
        self._submitted_tokens = 0
        self._settled_tokens = 0
        self._waiting: list[tuple[int, int, Job, Prepared]] = []
        self._order = itertools.count()
        self._running: list[_Seq] = []  # admission order
        self._arrived: set[Job] = set()  # accepted since the last admission pass
        self._thread: threading.Thread | None = None
        self._stopping = False
        self._last_decode: float | None = None  # when the last decode-only step began

    # -- any thread -------------------------------------------------------

    def start(self) -> Future[None]:
        """Start the worker; it loads the model, and the future resolves once it has."""
        loaded: Future[None] = Future()
        if self._thread is None:
            self._thread = threading.Thread(
                target=self._run, args=(loaded,), name="llama-batching", daemon=True
            )
            self._thread.start()
        return loaded

    def submit(self, job: Job) -> None:
        if self._thread is None or not self._thread.is_alive():
            raise EngineFailure("the batching worker is not running")
        self._submitted_tokens += job.estimate
        self._inbox.put(job)

    @property
    def prepare(self) -> Prepare | None:
        """The request preparer (chat template and tokenizer) once the model is
        loaded. Any thread may call it: tokenizing only reads the vocabulary."""
        return self._prepare

    def uncached(self, tokens: Sequence[int], salt: str | None) -> int:
        """Of a prompt's ``tokens`` in cache scope ``salt``, those it would prefill
        were it placed now: all but the longest prefix a slot holds (the slot it
        takes copies that one first, :func:`~servekit.engine.batching_slots.place`),
        and at least its last. A slot holds only what it has read so far, so a
        prompt still being prefilled counts as far as it got. Any thread may ask:
        the worker only appends to a slot's cache list or replaces it whole."""
        shared = max((reusable(slot, tokens, salt) for slot in self._slots), default=0)
        return len(tokens) - min(shared, len(tokens) - 1) if tokens else 0

    def pending_tokens(self) -> int:
        """The estimated uncached prompt tokens of the jobs not yet in a slot: in the
        inbox, or being tokenized (an idle worker takes a job at once, and for the
        milliseconds its template and tokenizer run it is in no other count)."""
        return max(0, self._submitted_tokens - self._settled_tokens)

    def cancel(self, job: Job) -> None:
        """The client went away: stop the job and drop its cache at the next step."""
        job.cancelled = True
        self._inbox.put(None)  # wake the loop if it is idle

    def stop(self, timeout: float = 10.0) -> None:
        """Stop the loop; unfinished jobs get :class:`EngineFailure`."""
        self._stopping = True
        self._inbox.put(None)
        if self._thread is not None:
            self._thread.join(timeout)
            if self._thread.is_alive():
                raise EngineFailure("batching worker did not stop")
            self._thread = None

    # -- worker thread ----------------------------------------------------

    def _run(self, loaded: Future[None]) -> None:
        # Every llama.cpp call that computes, loading and freeing included, happens
        # on this one thread (tokenizing, which reads the vocabulary and starts no
        # threads, may happen on the event loop: Scheduler.prepare). That is also
        # what keeps llama.cpp fast: its OpenMP workers spin between operations
        # only while one thread team exists per core set; a second calling thread
        # makes libgomp throttle spinning, and each decode then pays for sleeping
        # and waking threads at every operation.
        try:
            self._model, self._prepare = self._load()
        except BaseException as exc:
            loaded.set_exception(exc)
            return
        model = self._model
        if self._chunk < 1 or model.n_slots + self._chunk > model.n_batch:
            model.close()
            loaded.set_exception(ValueError("need 1 <= chunk_tokens <= n_batch - n_slots"))
            return
        self._slots = [Slot[_Seq](i) for i in range(model.n_slots)]
        loaded.set_result(None)
        try:
            while not self._stopping:
                if not self._running:
                    self._last_decode = None  # an idle wait is no token's cost
                self._intake(block=not self._running and not self._waiting)
                self._reap_cancelled()
                self._admit()
                if self._running:
                    self._step()
        except BaseException as exc:  # the worker must never die silently
            self._fail_all(exc if isinstance(exc, ServeError) else EngineFailure(repr(exc)))
            raise
        finally:
            self._fail_all(EngineFailure("engine stopped"))
            model.close()

    def _note_backlog(self) -> None:
        # What a newcomer's prefill waits behind (all of it first-come first-served;
        # with shortest first, the prompts with no more tokens left than its own).
        # Noted wherever it changes (a sequence admitted, a step's bookkeeping, a
        # sequence leaving), so it is current before a step that may take a
        # second and before an event reaches its client: a client that saw its
        # answer end must never read its prompt as still pending.
        remaining = tuple(len(seq.prompt) - seq.n_past for seq in self._running if seq.prefilling)
        self.stats.prefill_remaining = remaining if self._shortest_first else ()
        self.stats.prefill_backlog_tokens = sum(remaining)
        self.stats.slot_work = tuple(
            (len(seq.prompt) - seq.n_past, seq.max_new - seq.generated, seq.open_ended)
            for seq in self._running
        )

    def _intake(self, *, block: bool) -> None:
        try:
            item = self._inbox.get(timeout=1.0) if block else self._inbox.get_nowait()
        except queue.Empty:
            return
        while True:
            if item is not None:
                self._accept(item)
            try:
                item = self._inbox.get_nowait()
            except queue.Empty:
                return

    def _settle(self, job: Job) -> None:
        """The job's estimate stops counting: it has a slot (and the backlog, noted
        first, counts its tokens exactly) or it will never get one."""
        if job.priced:
            job.priced = False
            self._settled_tokens += job.estimate

    def _accept(self, job: Job) -> None:
        if job.cancelled:
            self._settle(job)
            return
        try:
            prepared = job.prepared or self._prepare_loaded(job.request)
        except Exception as exc:  # a bad prompt fails its own request, not the loop
            self._settle(job)
            job.emit(exc if isinstance(exc, ServeError) else EngineFailure(repr(exc)))
            self.stats.requests_failed += 1
            return
        entry = (int(job.request.priority), next(self._order), job, prepared)
        heapq.heappush(self._waiting, entry)
        self._arrived.add(job)
        self.stats.waiting = len(self._waiting)

    def _prepare_loaded(self, request: GenerationRequest) -> Prepared:
        prepare = self._prepare
        if prepare is None:  # the worker prepares only after loading
            raise EngineFailure("the model is not loaded")
        return prepare(request)

    def _reap_cancelled(self) -> None:
        if any(e[2].cancelled for e in self._waiting):
            for entry in self._waiting:
                if entry[2].cancelled:
                    self._settle(entry[2])
            self._waiting = [e for e in self._waiting if not e[2].cancelled]
            heapq.heapify(self._waiting)
            self.stats.waiting = len(self._waiting)
        for seq in [s for s in self._running if s.job.cancelled]:
            self._release(seq, keep_cache=False)
            self.stats.requests_cancelled += 1

    def _admit(self) -> None:
        try:
            self._admit_free()
        finally:
            self._arrived.clear()

    def _admit_free(self) -> None:
        while self._waiting:
            if all(s.seq is not None for s in self._slots):
                return
            _, _, job, prepared = heapq.heappop(self._waiting)
            self.stats.waiting = len(self._waiting)
            prompt = prepared.tokens
            salt = job.request.cache_salt  # a cache serves its own scope only
            now = time.monotonic()
            queued = [(e[3].tokens, e[2].request.cache_salt) for e in self._waiting]
            placed = place(self._slots, prompt, salt, queued)
            slot, shared = placed.slot, placed.shared
            if placed.source is not None:
                # Another slot holds more of the prompt: start from a copy of it.
                self._model.copy(placed.source.seq_id, slot.seq_id)
                self.stats.prefix_copies += 1
            # The last prompt token is always evaluated again: its logits start the answer.
            keep = self._model.forget(slot.seq_id, min(shared, len(prompt) - 1))
            slot.cached = prompt[:keep]
            slot.salt = salt
            self._estimator.hold(slot.seq_id, job.text, job.blocks, read=keep / len(prompt))
            self.stats.prompt_tokens += len(prompt)
            self.stats.reused_prompt_tokens += keep
            self.stats.admitted += 1
            seq = _Seq(
                job=job,
                prompt=prompt,
                max_new=prepared.max_new_tokens,
                text=TextStream(job.request.sampling.stop),
                sampler=SamplerChain(job.request.sampling, self._model.n_vocab, self._seed),
                slot=slot,
                n_past=keep,
                cached_prompt=keep,
                started=now,
                others=len(self._running),
                # A job that found a free slot as it arrived also waited for the step
                # in flight: part of what a busy engine costs it. One that queued for
                # a slot waited for a sequence to finish: the router counts that apart.
                since=job.submitted if job in self._arrived else now,
            )
            slot.seq = seq
            self._running.append(seq)
            self.stats.running = len(self._running)
            self._note_backlog()  # counted exactly before its estimate stops counting
            self._settle(job)

    def _step(self) -> None:
        # Prefill budget to the fewest tokens left first (or first-come first-served,
        # see the module docstring); the batch itself in slot order (see
        # batching_slots: consecutive sequence ids share one pass over the
        # weights), each sequence's tokens together.
        budget = self._chunk
        takes: dict[int, int] = {}
        order = self._running
        if self._shortest_first:  # sorted() is stable: ties keep admission order
            order = sorted(order, key=lambda s: len(s.prompt) - s.n_past)
        for seq in order:
            if budget <= 0:
                break
            if seq.prefilling:
                takes[id(seq)] = take = min(budget, len(seq.prompt) - seq.n_past)
                budget -= take
        items: list[BatchItem] = []
        decoding: list[_Seq] = []
        finishing_prefill: list[_Seq] = []
        for seq in sorted(self._running, key=lambda s: s.slot.seq_id):
            seq_id = seq.slot.seq_id
            if seq.next_token is not None:
                seq.out_index = len(items)
                items.append(BatchItem(seq.next_token, seq.n_past, seq_id, True))
                decoding.append(seq)
                continue
            take = takes.get(id(seq), 0)
            for j in range(seq.n_past, seq.n_past + take):
                last = j == len(seq.prompt) - 1
                if last:
                    seq.out_index = len(items)
                    finishing_prefill.append(seq)
                items.append(BatchItem(seq.prompt[j], j, seq_id, last))
        prefill_tokens = len(items) - len(decoding)
        started = time.perf_counter()
        # What a token costs a decoding sequence is the time from one decode-only
        # step to the next, its sampling and the worker's bookkeeping included:
        # under overload that was half as much again as llama_decode alone.
        previous, self._last_decode = self._last_decode, None if prefill_tokens else started
        self.stats.step_in_flight = (time.monotonic(), prefill_tokens)
        try:
            self._model.decode(items)
        except EngineFailure as exc:
            self.stats.step_in_flight = None
            for seq in list(self._running):
                self._fail(seq, exc)
            return
        self.stats.record_step(
            len({it.seq for it in items}),
            len(decoding),
            prefill_tokens,
            time.perf_counter() - started,
            period=None if previous is None or prefill_tokens else started - previous,
        )
        # Advance cache bookkeeping for everything that went into the batch.
        for it in items:
            slot = self._slots[it.seq]
            slot.cached.append(it.token)
            assert slot.seq is not None
            slot.seq.n_past = it.pos + 1
        for seq in self._running:
            if id(seq) in takes:  # a newcomer sharing its prompt copies what is read
                self._estimator.prefilled(seq.slot.seq_id, seq.n_past / len(seq.prompt))
        self._note_backlog()
        self.stats.step_in_flight = None  # after the backlog counts what it read
        for seq in decoding + finishing_prefill:
            self._sample(seq)

    def _sample(self, seq: _Seq) -> None:
        # Token accounting, text and finish reasons follow the single-sequence engine.
        token = seq.sampler.sample(self._model.ctx, seq.out_index)
        if seq.next_token is None:  # the first token: prefill just ended
            now = time.monotonic()
            self.stats.record_ttft(
                now - seq.started,
                running=seq.others,
                prefilled=len(seq.prompt) - seq.cached_prompt,
                from_arrival=now - seq.since,
            )
        if self._model.is_eog(token):
            self._finish(seq, "stop")
            return
        seq.generated += 1
        seq.unsent += 1
        text = seq.text.push(self._model.piece(token))
        if text:
            seq.said.append(text)
            seq.job.emit(TextDelta(text, seq.unsent))
            seq.unsent = 0
        if seq.text.stopped:
            self._finish(seq, "stop")
        elif seq.generated >= seq.max_new:
            self._finish(seq, "length")
        else:
            seq.next_token = token

    def _finish(self, seq: _Seq, reason: FinishReason) -> None:
        # Release first, so that load() never counts a sequence its client saw finish.
        self._release(seq, keep_cache=True)
        self.stats.requests_ok += 1
        if seq.open_ended:  # an answer's own length, not one cut at a client's max_tokens
            self.stats.record_completion(seq.generated)
        tail = seq.text.flush()
        if tail or seq.unsent:
            seq.job.emit(TextDelta(tail, seq.unsent))
        # What the slot keeps: the prompt and this answer, the next turn's history.
        self._estimator.answered(seq.slot.seq_id, seq.job.request, "".join([*seq.said, tail]))
        seq.job.emit(Finish(reason, len(seq.prompt), seq.generated, seq.cached_prompt))

    def _fail(self, seq: _Seq, exc: BaseException) -> None:
        self._release(seq, keep_cache=False)
        self.stats.requests_failed += 1
        seq.job.emit(exc)

    def _release(self, seq: _Seq, *, keep_cache: bool) -> None:
        seq.sampler.close()
        slot = seq.slot
        if not keep_cache:
            self._model.forget(slot.seq_id)
            slot.cached = []
            self._estimator.hold(slot.seq_id, "")
        slot.seq = None
        slot.last_used = time.monotonic()
        self._running.remove(seq)
        self.stats.running = len(self._running)
        self._note_backlog()

    def _fail_all(self, exc: ServeError) -> None:
        for seq in list(self._running):
            self._fail(seq, exc)
        for _, _, job, _ in self._waiting:
            self._settle(job)
            job.emit(exc)
        self._waiting.clear()
        while True:
            try:
                item = self._inbox.get_nowait()
            except queue.Empty:
                break
            if item is not None:
                self._settle(item)
                if not item.cancelled:
                    item.emit(exc)
        self.stats.waiting = 0
