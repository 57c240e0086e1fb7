"""Jobs on their way to a slot of the batching engine, and the admission pass
that places them.

A job arrives through the inbox (any thread submits or cancels; the worker
takes new jobs and cancellations from it, never blocking while work is
running), is tokenized on the worker unless its caller did that already, and
waits by priority, then arrival. The admission pass admits waiting jobs into
free slots (``batching_slots.place``), preferring the slot whose cached tokens
share the longest prefix with the new prompt (only the differing tail of that
slot's cache is removed; only a slot of the request's cache scope counts).

Until it has a slot, a job counts as the uncached tokens it was priced at
(:meth:`WaitingJobs.pending_tokens`); once it has one, the backlog the running
sequences note counts its prompt exactly.
"""

from __future__ import annotations

import heapq
import itertools
import queue
import time

from servekit.engine.batching_jobs import Job, Prepare, Prepared, Seq
from servekit.engine.batching_sampler import SamplerChain
from servekit.engine.batching_slots import place
from servekit.engine.batching_stats import BatchingStats
from servekit.engine.batching_step import Batch
from servekit.engine.prompt_estimate import PromptEstimator
from servekit.engine.textstream import TextStream
from servekit.errors import EngineFailure, ServeError

__all__ = ["WaitingJobs"]


class WaitingJobs:
    """The inbox and the waiting queue. :meth:`put`, :meth:`wake` and
    :meth:`pending_tokens` are for any thread; the rest is the worker's."""

    def __init__(
        self,
        prepare: Prepare,
        *,
        stats: BatchingStats,
        estimator: PromptEstimator,
        seed: int | None,
    ) -> None:
        self._prepare = prepare
        self._stats = stats
        self._estimator = estimator
        self._seed = seed
        self._inbox: queue.SimpleQueue[Job | None] = queue.SimpleQueue()
        # The estimated prompt tokens of jobs submitted / settled (admitted to a
        # slot, where the backlog counts them exactly, or dropped), each written
        # by one thread only.
        self._submitted_tokens = 0
        self._settled_tokens = 0
        self._waiting: list[tuple[int, int, Job, Prepared]] = []
        self._order = itertools.count()
        self._arrived: set[Job] = set()  # accepted since the last admission pass

    # -- any thread -------------------------------------------------------

    def put(self, job: Job) -> None:
        self._submitted_tokens += job.estimate
        self._inbox.put(job)

    def wake(self) -> None:
        """Wake the worker if it waits on an empty inbox."""
        self._inbox.put(None)

    def pending_tokens(self) -> int:
        """The estimated uncached prompt tokens of the jobs not yet in a slot: in the
        inbox, or being tokenized (an idle worker takes a job at once, and for the
        milliseconds its template and tokenizer run it is in no other count)."""
        return max(0, self._submitted_tokens - self._settled_tokens)

    # -- worker thread ----------------------------------------------------

    @property
    def waiting(self) -> int:
        """Jobs taken from the inbox and waiting for a slot."""
        return len(self._waiting)

    def intake(self, *, block: bool) -> None:
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
            prepared = job.prepared or self._prepare(job.request)
        except Exception as exc:  # a bad prompt fails its own request, not the loop
            self._settle(job)
            job.emit(exc if isinstance(exc, ServeError) else EngineFailure(repr(exc)))
            self._stats.requests_failed += 1
            return
        entry = (int(job.request.priority), next(self._order), job, prepared)
        heapq.heappush(self._waiting, entry)
        self._arrived.add(job)
        self._stats.waiting = len(self._waiting)

    def reap_cancelled(self) -> None:
        """Drop the cancelled jobs still waiting."""
        if any(e[2].cancelled for e in self._waiting):
            for entry in self._waiting:
                if entry[2].cancelled:
                    self._settle(entry[2])
            self._waiting = [e for e in self._waiting if not e[2].cancelled]
            heapq.heapify(self._waiting)
            self._stats.waiting = len(self._waiting)

    def admit(self, batch: Batch) -> None:
        """Place waiting jobs in ``batch``'s free slots, best first."""
        try:
            self._admit_free(batch)
        finally:
            self._arrived.clear()

    def _admit_free(self, batch: Batch) -> None:
        model = batch.model
        while self._waiting:
            if all(s.seq is not None for s in batch.slots):
                return
            _, _, job, prepared = heapq.heappop(self._waiting)
            self._stats.waiting = len(self._waiting)
            prompt = prepared.tokens
            salt = job.request.cache_salt  # a cache serves its own scope only
            now = time.monotonic()
            queued = [(e[3].tokens, e[2].request.cache_salt) for e in self._waiting]
            placed = place(batch.slots, prompt, salt, queued)
            slot, shared = placed.slot, placed.shared
            if placed.source is not None:
                # Another slot holds more of the prompt: start from a copy of it.
                model.copy(placed.source.seq_id, slot.seq_id)
                self._stats.prefix_copies += 1
            # The last prompt token is always evaluated again: its logits start the answer.
            keep = model.forget(slot.seq_id, min(shared, len(prompt) - 1))
            slot.cached = prompt[:keep]
            slot.salt = salt
            self._estimator.hold(slot.seq_id, job.text, job.blocks, read=keep / len(prompt))
            self._stats.prompt_tokens += len(prompt)
            self._stats.reused_prompt_tokens += keep
            self._stats.admitted += 1
            seq = Seq(
                job=job,
                prompt=prompt,
                max_new=prepared.max_new_tokens,
                text=TextStream(job.request.sampling.stop),
                sampler=SamplerChain(job.request.sampling, model.n_vocab, self._seed),
                slot=slot,
                n_past=keep,
                cached_prompt=keep,
                started=now,
                others=len(batch.running),
                # A job that found a free slot as it arrived also waited for the step
                # in flight: part of what a busy engine costs it. One that queued for
                # a slot waited for a sequence to finish: the router counts that apart.
                since=job.submitted if job in self._arrived else now,
            )
            batch.add(seq)  # counted exactly before its estimate stops counting
            self._settle(job)

    def fail_all(self, exc: ServeError) -> None:
        """The jobs not yet in a slot fail with ``exc`` (a cancelled one still in
        the inbox only stops counting)."""
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
        self._stats.waiting = 0
