"""The continuous-batching scheduler: one worker thread drives every llama.cpp call.

Each step of the loop:

1. takes new jobs and cancellations from the inbox (never blocking while
   work is running);
2. frees the slots of cancelled sequences (their KV cache is dropped);
3. admits waiting jobs into free slots, preferring the slot whose cache shares
   the longest prefix with the prompt (:mod:`servekit.engine.batching_waiting`);
4. builds one batch (each decoding sequence's next token, up to
   ``chunk_tokens`` prompt tokens), runs one ``llama_decode`` and samples
   (:mod:`servekit.engine.batching_step`).

What a job and a running sequence hold is :mod:`servekit.engine.batching_jobs`.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from concurrent.futures import Future

from servekit.engine.batching_jobs import Job, Prepare, Prepared
from servekit.engine.batching_llama import LlamaBatchModel
from servekit.engine.batching_slots import reusable
from servekit.engine.batching_stats import BatchingStats
from servekit.engine.batching_step import Batch
from servekit.engine.batching_waiting import WaitingJobs
from servekit.engine.prompt_estimate import PromptEstimator
from servekit.engine.protocol import GenerationRequest
from servekit.errors import EngineFailure, ServeError

__all__ = ["Scheduler"]


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
        self._prepare: Prepare | None = None  # set by the worker once loaded
        self._chunk = chunk_tokens
        self._shortest_first = shortest_first
        self.stats = stats
        self._jobs = WaitingJobs(self._prepare_loaded, stats=stats, estimator=estimator, seed=seed)
        self._batch: Batch | None = None  # made by the worker once loaded
        self._thread: threading.Thread | None = None
        self._stopping = False

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
        self._jobs.put(job)

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
        slots = [] if self._batch is None else self._batch.slots
        shared = max((reusable(slot, tokens, salt) for slot in slots), default=0)
        return len(tokens) - min(shared, len(tokens) - 1) if tokens else 0

    def pending_tokens(self) -> int:
        """The estimated uncached prompt tokens of the jobs not yet in a slot
        (:meth:`servekit.engine.batching_waiting.WaitingJobs.pending_tokens`)."""
        return self._jobs.pending_tokens()

    def cancel(self, job: Job) -> None:
        """The client went away: stop the job and drop its cache at the next step."""
        job.cancelled = True
        self._jobs.wake()  # wake the loop if it is idle

    def stop(self, timeout: float = 10.0) -> None:
        """Stop the loop; unfinished jobs get :class:`EngineFailure`."""
        self._stopping = True
        self._jobs.wake()
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
            model, self._prepare = self._load()
        except BaseException as exc:
            loaded.set_exception(exc)
            return
        if self._chunk < 1 or model.n_slots + self._chunk > model.n_batch:
            model.close()
            loaded.set_exception(ValueError("need 1 <= chunk_tokens <= n_batch - n_slots"))
            return
        batch = self._batch = Batch(
            model,
            chunk_tokens=self._chunk,
            shortest_first=self._shortest_first,
            stats=self.stats,
            estimator=self._estimator,
        )
        loaded.set_result(None)
        jobs = self._jobs
        try:
            while not self._stopping:
                if not batch.running:
                    batch.idle()
                jobs.intake(block=not batch.running and not jobs.waiting)
                jobs.reap_cancelled()
                batch.reap_cancelled()
                jobs.admit(batch)
                if batch.running:
                    batch.step()
        except BaseException as exc:  # the worker must never die silently
            self._fail_all(batch, exc if isinstance(exc, ServeError) else EngineFailure(repr(exc)))
            raise
        finally:
            self._fail_all(batch, EngineFailure("engine stopped"))
            model.close()

    def _fail_all(self, batch: Batch, exc: ServeError) -> None:
        batch.fail_all(exc)
        self._jobs.fail_all(exc)

    def _prepare_loaded(self, request: GenerationRequest) -> Prepared:
        prepare = self._prepare
        if prepare is None:  # the worker prepares only after loading
            raise EngineFailure("the model is not loaded")
        return prepare(request)
