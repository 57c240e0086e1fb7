"""One simulated engine instance: slots, a FIFO prefill server and a
continuously batched decode whose step time grows with the batch.

Prefill has priority and stalls decode while it runs (vLLM without chunked
prefill; llama.cpp's single sequence trivially). Decode is fluid: all running
sequences advance one token per step, so the instance keeps a virtual token
clock ``V`` and a heap of the ``V`` at which each sequence finishes; only
arrivals, prefill ends and completions are events, never single tokens.
"""

from __future__ import annotations

import heapq
from collections import deque
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Literal, Protocol

from hybrid_llm.sim.events import EventLoop
from hybrid_llm.sim.profiles import EngineProfile

if TYPE_CHECKING:
    from hybrid_llm.sim.request import Job

__all__ = ["Instance", "InstanceSink", "LoadView"]

_EPS = 1e-12


class InstanceSink(Protocol):
    """Who hears about a job's first token and completion (the simulation)."""

    def first_token(self, job: Job, now: float) -> None: ...

    def done(self, job: Job, now: float) -> None: ...


@dataclass(frozen=True)
class LoadView:
    """What the router sees of an instance: the fields of servekit's LoadReport."""

    waiting: int
    running: int
    capacity: int
    queue_limit: int
    prefill_tokens_per_s: float
    decode_step_s: float


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
    decode: list[tuple[float, int, Job]] = field(default_factory=list)
    decode_n: int = 0
    vclock: float = 0.0
    last: float = 0.0
    busy: float = 0.0
    epoch: int = 0
    served: int = 0
    occupied: float = 0.0  # integral of used slots over time
    _seq: int = 0

    def __post_init__(self) -> None:
        # Hot-path copies of the profile (pydantic attribute access is slow).
        self._base = self.profile.decode_base_ms / 1000.0
        self._per = self.profile.decode_per_seq_ms / 1000.0
        self._slots = self.profile.slots

        self.marks: list[tuple[float, float]] = [(0.0, 0.0), (0.0, 0.0)]

    def mark(self, which: int) -> None:
        """Record (busy, occupied) so far; 0 and 1 bound the measured window."""
        self._advance(self.loop.now)
        self.marks[which] = (self.busy, self.occupied)

    def _step(self, batch: int) -> float:
        return self._base + self._per * (batch - 1 if batch > 1 else 0)

    @property
    def backlog(self) -> int:
        """Requests accepted but not yet producing tokens."""
        return len(self.waiting) + len(self.prefill_q)

    @property
    def active(self) -> int:
        """Requests prefilling or decoding."""
        return self.decode_n + (1 if self.prefill_job is not None else 0)

    # -- what the router sees -------------------------------------------------
    def load(self) -> LoadView:
        return LoadView(
            waiting=self.backlog,
            running=self.active,
            capacity=self._slots,
            queue_limit=self.profile.queue_limit,
            prefill_tokens_per_s=self.profile.prefill_tokens_per_s,
            decode_step_s=self._step(self.decode_n),
        )

    def full(self) -> bool:
        return self.used >= self._slots and len(self.waiting) >= self.profile.queue_limit

    # -- requests arriving and leaving ----------------------------------------
    def submit(self, job: Job) -> bool:
        """Accept ``job`` now, or ``False`` when the queue is full (a 429)."""
        if self.full():
            return False
        job.instance = self
        now = self.loop.now
        self._advance(now)
        if self.used < self._slots:
            self.used += 1
            job.state = "prefill_q"
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
                self.busy += dt
            elif self.decode_n:
                self.busy += dt
                self.vclock += dt / self._step(self.decode_n)
        self.last = now

    def _free(self, now: float) -> None:
        self.used -= 1
        while self.waiting and self.used < self._slots:
            job = self.waiting.popleft()
            self.used += 1
            job.state = "prefill_q"
            self.prefill_q.append(job)

    def _settle(self, now: float) -> None:
        if self.prefill_job is None and self.prefill_q:
            job = self.prefill_q.popleft()
            job.state = "prefill"
            self.prefill_job = job
            self.prefill_end = now + self.profile.prefill_s(job.req.prompt_tokens)
        self.epoch += 1
        if self.prefill_job is not None:
            self.loop.at(self.prefill_end, self._fire, self.epoch)
            return
        heap = self.decode
        while heap and heap[0][2].cancelled:
            heapq.heappop(heap)
        if heap:
            wait = max(0.0, heap[0][0] - self.vclock) * self._step(self.decode_n)
            self.loop.at(now + wait, self._fire, self.epoch)

    def _fire(self, epoch: int) -> None:
        if epoch != self.epoch:
            return  # superseded by a later state change
        now = self.loop.now
        self._advance(now)
        job = self.prefill_job
        if job is not None:
            self.prefill_job = None
            job.first_token = now
            self.sink.first_token(job, now)
            if job.req.output_tokens <= 1:
                self._finish(job, now)
            else:
                self._seq += 1
                job.state = "decode"
                heapq.heappush(
                    self.decode, (self.vclock + job.req.output_tokens - 1, self._seq, job)
                )
                self.decode_n += 1
        else:
            heap = self.decode
            while heap and heap[0][0] <= self.vclock + 1e-9:
                _, _, done = heapq.heappop(heap)
                if done.cancelled:
                    continue
                self.decode_n -= 1
                self._finish(done, now)
        self._settle(now)

    def _finish(self, job: Job, now: float) -> None:
        job.state = "done"
        job.done = now
        self.served += 1
        self._free(now)
        self.sink.done(job, now)
