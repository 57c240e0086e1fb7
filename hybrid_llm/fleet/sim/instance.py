"""One simulated engine instance: slots, a FIFO prefill server and a
continuously batched decode whose step time grows with the batch.

The batching scheduler it follows (``servekit.engine.batching_step``) builds
every step from one token of each decoding sequence plus up to ``chunk_tokens``
prompt tokens of one prefilling sequence, so a prefill slows the decoders
without starving them: here a prefill takes its measured time (the profile's
TTFT at that prompt length) plus the per-sequence cost of the decoders riding
along, and each decoder gains one token per prefill step. How long a
prefill and a decode step take is :mod:`hybrid_llm.fleet.sim.service_time`'s.

Decode is fluid: all running sequences advance one token per step, so the
instance keeps a virtual token clock ``V`` and a heap of the ``V`` at which
each sequence finishes; only arrivals, prefill ends and completions are
events, never single tokens.

Times vary as the real engine's did when the profile carries its measured
dispersion: each prefill is scaled by a ratio drawn from
``prefill_spread``, and each decode stretch between events runs at the mean
of as many step times drawn from ``step_spread`` (at that batch size) as it
has steps. The draws come from the instance's own seeded RNG, so a run is
reproducible for a seed; a profile without spreads draws nothing.

What the instance reports (:meth:`Instance.report`) is what an edge's
``/load`` carries, from the engine's own bookkeeping
(:class:`servekit.engine.batching_stats.BatchingStats` on the simulated
clock): slots in use and waiting, TTFT P50/P95 of the last 512 sequences
(from slot to first token), the busy slowdown per running sequence (from the
same admissions), decode and prefill rates over the last 10 s of steps.

An edge may protect its TTFT (:class:`~hybrid_llm.fleet.sim.protection.EdgeProtection`,
each off by default): a cap on the sequences it runs, with no queue behind
them; chunked prefill, shortest prompt first between chunks; refusing a
request whose predicted TTFT is over a budget.
"""

from __future__ import annotations

import heapq
import random
from collections import deque
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Literal, Protocol

from hybrid_llm.fleet.sim.events import EventLoop
from hybrid_llm.fleet.sim.profiles import EngineProfile
from hybrid_llm.fleet.sim.protection import EdgeProtection, predicted_wait_ms
from hybrid_llm.fleet.sim.service_time import (
    DecodeSteps,
    prefill_s,
    prefill_steps,
    riders_s,
    uncached_tokens,
)
from hybrid_llm.fleet.sim.spread import SpreadSampler
from hybrid_llm.fleet.sim.warm import warm_stats
from servekit.admission import over_ttft_budget
from servekit.engine.batching_stats import BatchingStats
from servekit.engine.protocol import LoadReport

if TYPE_CHECKING:
    from hybrid_llm.fleet.sim.config import WarmState
    from hybrid_llm.fleet.sim.request import Job

__all__ = ["Instance", "InstanceSink"]


class InstanceSink(Protocol):
    """Who hears about a job's first token and completion (the simulation)."""

    def first_token(self, job: Job, now: float) -> None: ...

    def done(self, job: Job, now: float) -> None: ...


@dataclass(eq=False)
class Instance:
    name: str
    tier: Literal["edge", "center"]
    region: str
    profile: EngineProfile
    loop: EventLoop
    sink: InstanceSink
    used: int = 0
    waiting: deque[Job] = field(default_factory=deque)
    prefill_q: deque[Job] = field(default_factory=deque)
    prefill_job: Job | None = None
    prefill_end: float = 0.0
    prefill_start: float = 0.0
    decode: list[tuple[float, int, Job]] = field(default_factory=list)
    decode_n: int = 0
    vclock: float = 0.0
    last: float = 0.0
    busy: float = 0.0
    epoch: int = 0
    served: int = 0
    occupied: float = 0.0  # integral of used slots over time
    _seq: int = 0
    _carry: float = 0.0  # decoded token fraction not yet recorded as a step
    rng: random.Random = field(default_factory=lambda: random.Random(0))
    protection: EdgeProtection = field(default_factory=EdgeProtection)
    shed: int = 0  # requests refused on the TTFT budget
    held: set[str] = field(default_factory=set)  # cached prefixes (SimRequest.prefix)

    def __post_init__(self) -> None:
        guard = self.protection
        self._slots = min(self.profile.slots, guard.max_decoders or self.profile.slots)
        # A capped edge refuses beyond the cap instead of queueing: the router spills.
        self._queue_limit = 0 if guard.max_decoders is not None else self.profile.queue_limit
        self._chunk = self.profile.chunk_tokens
        self._prefill_chunk = guard.prefill_chunk_tokens  # chunked, shortest first
        self._budget_ms = guard.ttft_budget_ms
        self._step_tokens = 0  # prompt tokens of the chunk in flight
        self._step_own_s = 0.0  # its share of the prompt's prefill time
        # Measured dispersion: prefill times and decode steps drawn around the medians.
        self._prefill_spread = SpreadSampler(self.profile.prefill_spread, self.rng)
        self._decode_steps = DecodeSteps(self.profile, self.rng)
        self._seg_step = self._decode_steps.median_s(1)  # of the decode segment now running
        self.stats = BatchingStats(slots=self._slots)
        self.marks: list[tuple[float, float]] = [(0.0, 0.0), (0.0, 0.0)]

    def mark(self, which: int) -> None:
        """Record (busy, occupied) so far; 0 and 1 bound the measured window."""
        self._advance(self.loop.now)
        self.marks[which] = (self.busy, self.occupied)

    @property
    def backlog(self) -> int:
        """Requests accepted but not yet producing tokens."""
        return len(self.waiting) + len(self.prefill_q)

    @property
    def active(self) -> int:
        """Requests prefilling or decoding."""
        return self.decode_n + (1 if self.prefill_job is not None else 0)

    # -- what the router sees -------------------------------------------------
    def report(self) -> LoadReport:
        """The instance's ``/load`` now: the engine's figures, the admission queue's counts."""
        self._advance(self.loop.now)  # steps up to now are done
        snap = self.stats.snapshot()
        return LoadReport(
            ready=True,
            waiting=len(self.waiting),
            running=self.used,
            capacity=self._slots,
            queue_limit=self._queue_limit,
            ttft_p50_ms=snap.ttft_p50_ms,
            ttft_p95_ms=snap.ttft_p95_ms,
            busy_ms_per_seq=snap.busy_ms_per_seq,
            decode_tokens_per_s=snap.decode_tokens_per_s,
            prefill_tokens_per_s=snap.prefill_tokens_per_s,
            ttft_budget_ms=self._budget_ms,
            predicted_wait_ms=None if self._budget_ms is None else self._wait_ms(),
        )

    def warm(self, state: WarmState) -> None:
        """Start from the figures a real engine reported (its history before the run)."""
        warm_stats(self.stats, self.loop.now, state)

    def full(self) -> bool:
        return self.used >= self._slots and len(self.waiting) >= self._queue_limit

    # -- the TTFT budget: what admission predicts (servekit.admission) ---------
    def _prefill_rate(self) -> float:
        return self.stats.prefill_rate() or self.profile.prefill_tokens_per_s

    def _prefill_left(self, job: Job) -> int:
        """Prompt tokens ``job`` has left to prefill (all of them before its first chunk)."""
        return job.prefill_left_tokens or uncached_tokens(job)

    def _wait_ms(self) -> float | None:
        """A newcomer's predicted wait before its own prefill; None: unknown."""
        prefilling = list(self.prefill_q)
        if self.prefill_job is not None:
            prefilling.append(self.prefill_job)
        return predicted_wait_ms(
            slots=self._slots,
            running=self.used,
            waiting=len(self.waiting),
            prefill_left=[self._prefill_left(j) for j in prefilling],
            decoding=self.decode_n,
            prefill_tokens_per_s=self._prefill_rate(),
            # the engine's own step time
            decode_step_s=self._decode_steps.median_s(max(1, self.decode_n)),
            typical_tokens=self.stats.typical_completion(),
            chunk_tokens=self._prefill_chunk,
            busy_ms_per_seq=self.stats.snapshot().busy_ms_per_seq,
        )

    def _over_budget(self, job: Job) -> bool:
        if self._budget_ms is None:
            return False
        wait = self._wait_ms()
        own_ms = uncached_tokens(job) / self._prefill_rate() * 1000.0
        idle = self.used == 0 and not self.waiting  # as the real edge's admission judges it
        return wait is None or over_ttft_budget(wait, own_ms, self._budget_ms, idle=idle)

    # -- requests arriving and leaving ----------------------------------------
    def submit(self, job: Job) -> bool:
        """Accept ``job`` now, or ``False`` (a 429) when the queue is full or, under a
        TTFT budget, its predicted TTFT here is over it."""
        if self.full():
            return False
        job.cached = job.req.cached_at(self.holds(job.req.prefix))
        now = self.loop.now
        self._advance(now)
        if self._over_budget(job):
            self.shed += 1
            return False
        job.instance = self
        # Its prefix is cached here once its prefill ran, and prefills run in arrival
        # order: a later request finds it (the router's prefix index counts it from now).
        keys = (job.req.prefix, job.req.conversation)
        job.brought = tuple(k for k in keys if k is not None and k not in self.held)
        self.held.update(job.brought)
        if self.used < self._slots:
            job.others = self.used
            self.used += 1
            job.state = "prefill_q"
            job.admitted = now
            self.prefill_q.append(job)
        else:
            job.state = "waiting"
            self.waiting.append(job)
        self._settle(now)
        return True

    def cancel(self, job: Job) -> None:
        """Abort ``job`` wherever it is (a hedge that lost the race)."""
        if job.cancelled or job.state == "done":
            return
        job.cancelled = True
        now = self.loop.now
        self._advance(now)
        if job.state in ("waiting", "prefill_q", "prefill"):
            self.held.difference_update(job.brought)  # its prefill never finished here
        if job.state == "waiting":
            self.waiting.remove(job)
        elif job.state == "prefill_q":
            self.prefill_q.remove(job)
            self._free(now)
        elif job.state == "prefill":
            self.prefill_job = None
            self._free(now)
        elif job.state == "decode":
            self.decode_n -= 1  # its heap entry is skipped when it surfaces
            self._free(now)
        job.state = "done"
        self._settle(now)

    # -- internals ------------------------------------------------------------
    def _advance(self, now: float) -> None:
        dt = now - self.last
        if dt > 0:
            self.occupied += self.used * dt
            if self.prefill_job is not None:
                self.busy += dt  # recorded as one step when the prefill ends
            elif self.decode_n:
                self.busy += dt
                steps = dt / self._seg_step
                self.vclock += steps
                tokens = steps * self.decode_n + self._carry
                whole = int(tokens)
                self._carry = tokens - whole
                self.stats.record_step(self.decode_n, whole, 0, dt, now=now)
        self.last = now

    def _free(self, now: float) -> None:
        self.used -= 1
        while self.waiting and self.used < self._slots:
            job = self.waiting.popleft()
            job.others = self.used
            self.used += 1
            job.state = "prefill_q"
            job.admitted = now
            self.prefill_q.append(job)

    def holds(self, prefix: str | None) -> bool:
        """Whether this instance's cache holds ``prefix`` (it served a request with it)."""
        return prefix is None or prefix in self.held

    def _riders_s(self, steps: int, boundary: bool) -> float:
        """What the decoders running now add to a prefill of ``steps`` steps."""
        n = self.decode_n
        return riders_s(self.profile, n, self._decode_steps.median_s(n), steps, boundary)

    def _settle(self, now: float, boundary: bool = False) -> None:
        if self.prefill_job is None and self.prefill_q and self._prefill_chunk is not None:
            self._start_chunk(now, boundary)
        elif self.prefill_job is None and self.prefill_q:
            job = self.prefill_q.popleft()
            job.state = "prefill"
            self.prefill_job = job
            self.prefill_start = now
            riders = self._riders_s(prefill_steps(job, self._chunk), boundary)
            cost = max(0.0, prefill_s(self.profile, job) + riders)
            self.prefill_end = now + cost * self._prefill_spread.draw()
        self.epoch += 1
        if self.prefill_job is not None:
            self.loop.at(self.prefill_end, self._fire, self.epoch)
            return
        heap = self.decode
        while heap and heap[0][2].cancelled:
            heapq.heappop(heap)
        if heap:
            left = max(0.0, heap[0][0] - self.vclock)
            n = self.decode_n
            self._seg_step = self._decode_steps.median_s(n) * self._decode_steps.factor(n, left)
            self.loop.at(now + left * self._seg_step, self._fire, self.epoch)

    def _start_chunk(self, now: float, boundary: bool) -> None:
        """Prefill one chunk of the prompt with the fewest tokens left (the earliest
        admitted among equals). A prompt's prefill time is drawn at its first chunk
        and spent in proportion to the tokens of each; the decoders ride along in
        every chunk's step."""
        job = min(self.prefill_q, key=self._prefill_left)
        self.prefill_q.remove(job)
        if not job.prefill_left_tokens:
            job.prefill_left_tokens = uncached_tokens(job)
            # drawn as in _settle
            job.prefill_left_s = prefill_s(self.profile, job) * self._prefill_spread.draw()
        tokens = min(self._prefill_chunk or job.prefill_left_tokens, job.prefill_left_tokens)
        self._step_tokens = tokens
        self._step_own_s = job.prefill_left_s * tokens / job.prefill_left_tokens
        job.state = "prefill"
        self.prefill_job = job
        self.prefill_start = now
        self.prefill_end = now + max(0.0, self._step_own_s + self._riders_s(1, boundary))

    def _chunk_done(self, job: Job, now: float) -> None:
        """A chunk's step ended: one token for each decoder; the prompt's first
        token when it was its last chunk, else it waits for its next turn."""
        self.prefill_job = None
        decoders = self.decode_n
        if decoders:
            self.vclock += 1
        tokens = self._step_tokens
        self.stats.record_step(decoders + 1, decoders, tokens, now - self.prefill_start, now=now)
        job.prefill_left_tokens -= tokens
        job.prefill_left_s -= self._step_own_s
        if job.prefill_left_tokens > 0:
            job.state = "prefill_q"
            self.prefill_q.appendleft(job)  # first among equals: it started first
            return
        self._first_token(job, now)

    def _fire(self, epoch: int) -> None:
        if epoch != self.epoch:
            return  # superseded by a later state change
        now = self.loop.now
        self._advance(now)
        job = self.prefill_job
        if job is not None and self._prefill_chunk is not None:
            self._chunk_done(job, now)
        elif job is not None:
            self._prefilled(job, now)
        heap = self.decode
        while heap and heap[0][0] <= self.vclock + 1e-9:
            _, _, done = heapq.heappop(heap)
            if done.cancelled:
                continue
            self.decode_n -= 1
            self._finish(done, now)
        self._settle(now, boundary=True)  # the steps in flight ended here

    def _prefilled(self, job: Job, now: float) -> None:
        self.prefill_job = None
        steps = prefill_steps(job, self._chunk)
        decoders = self.decode_n
        if decoders:
            self.vclock += steps  # one token of every decoder per prefill step
        self.stats.record_step(
            decoders + 1, decoders * steps, uncached_tokens(job), now - self.prefill_start, now=now
        )
        self._first_token(job, now)

    def _first_token(self, job: Job, now: float) -> None:
        self.stats.record_ttft(
            now - job.admitted, running=job.others, prefilled=uncached_tokens(job)
        )
        job.first_token = now
        self.sink.first_token(job, now)
        if job.req.output_tokens <= 1:
            self._finish(job, now)
        else:
            self._seq += 1
            job.state = "decode"
            heapq.heappush(self.decode, (self.vclock + job.req.output_tokens - 1, self._seq, job))
            self.decode_n += 1

    def _finish(self, job: Job, now: float) -> None:
        job.state = "done"
        job.done = now
        self.served += 1
        if self._budget_ms is not None:  # what the budget's slot-release estimate reads
            self.stats.record_completion(job.req.output_tokens)
        self._free(now)
        self.sink.done(job, now)
