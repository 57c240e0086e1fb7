"""A simulated user request and its copies (jobs) on instances."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Literal

if TYPE_CHECKING:
    from hybrid_llm.fleet.sim.instance import Instance
    from hybrid_llm.fleet.sim.policy import Target

__all__ = ["Job", "SimRequest"]


@dataclass(eq=False)
class SimRequest:
    id: int
    region: str
    arrival: float
    prompt_tokens: int
    output_tokens: int
    hard: bool
    cached_tokens: int = 0  # leading prompt tokens an engine copies from another slot
    history_tokens: int = 0  # of those, earlier turns the serving instance already holds
    # Of them, the preamble the profile's own prompts shared: its measured prefill
    # times already hold that copy, the rest of the cached tokens come off them
    # (None: all but the history).
    preamble_tokens: int | None = None
    # Which cached prefix the rest is (a system prompt, a conversation's history):
    # only an instance that holds it has them cached (None: every instance does);
    # serving the request leaves it and ``conversation`` there.
    prefix: str | None = None
    conversation: str | None = None
    estimated_tokens: int = 0  # what the router estimates from the client's text
    jobs: list[Job] = field(default_factory=list)
    winner: Job | None = None
    ttft: float | None = None
    tpot: float | None = None
    e2e: float | None = None
    hedged: bool = False
    fallbacks: int = 0
    failed: bool = False

    def cached_at(self, holds_prefix: bool) -> int:
        """Cached tokens on an instance that holds this request's prefix, or not (the
        preamble, which every instance copies from its own slots)."""
        if holds_prefix or self.prefix is None:
            return self.cached_tokens
        preamble = self.preamble_tokens
        if preamble is None:
            preamble = self.cached_tokens - self.history_tokens
        return min(self.cached_tokens, preamble)


@dataclass(eq=False)
class Job:
    req: SimRequest
    rtt: float  # router <-> this instance, seconds
    target: Target | None = None  # what the router sent it to (an edge, the center)
    sent: float = 0.0  # when the router sent it
    instance: Instance | None = None
    admitted: float = 0.0  # when it got a slot (the engine's TTFT starts there)
    others: int = 0  # sequences in the instance's other slots at that moment
    cached: int = 0  # prompt tokens the instance found cached when its prefill began
    brought: tuple[str, ...] = ()  # prefixes the instance holds since it accepted this job
    state: Literal["new", "waiting", "prefill_q", "prefill", "decode", "done"] = "new"
    cancelled: bool = False
    released: bool = False  # the router no longer counts it in flight
    first_token: float | None = None
    done: float | None = None
    prefill_left_tokens: int = 0  # chunked prefill: prompt tokens left once started
    prefill_left_s: float = 0.0  # and the prefill time they take
