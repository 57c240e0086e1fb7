"""What the batching scheduler holds: jobs on their way to a slot, and the
sequences running in slots.

A :class:`Job` is what a caller submits (:mod:`servekit.engine.batching_sched`);
it waits, tokenized (:class:`Prepared`), until the admission pass
(:mod:`servekit.engine.batching_waiting`) places it in a slot as a :class:`Seq`,
which each step advances (:mod:`servekit.engine.batching_step`).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field

from servekit.engine.batching_sampler import SamplerChain
from servekit.engine.batching_slots import Slot
from servekit.engine.protocol import Finish, GenerationRequest, TextDelta
from servekit.engine.textstream import TextStream

__all__ = ["Emit", "Job", "Prepare", "Prepared", "Seq"]


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
    (:meth:`servekit.engine.batching_sched.Scheduler.uncached`)."""

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
class Seq:
    """A job running in a slot."""

    job: Job
    prompt: list[int]
    max_new: int
    text: TextStream
    sampler: SamplerChain
    slot: Slot[Seq]
    n_past: int  # tokens of this sequence already in the slot's cache
    cached_prompt: int
    generated: int = 0  # completion tokens (an end-of-generation token is not one)
    unsent: int = 0  # tokens whose text is still held back by the text stream
    said: list[str] = field(default_factory=list)  # the text sent, which its slot keeps
    started: float = 0.0
    others: int = 0  # sequences running in other slots when it got its own
    since: float = 0.0  # when its busy-slowdown sample starts (see WaitingJobs.admit)
    next_token: int | None = None  # sampled, not yet in the cache
    out_index: int = -1  # batch index of this sequence's logits in the current step

    @property
    def prefilling(self) -> bool:
        return self.n_past < len(self.prompt)

    @property
    def open_ended(self) -> bool:
        """Its request set no max_tokens: it may run to the end of its slot."""
        return self.job.request.sampling.max_tokens is None
