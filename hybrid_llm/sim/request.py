"""A simulated user request and its copies (jobs) on instances."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Literal

if TYPE_CHECKING:
    from hybrid_llm.sim.instance import Instance

__all__ = ["Job", "SimRequest"]


@dataclass(eq=False)
class SimRequest:
    id: int
    region: str
    arrival: float
    prompt_tokens: int
    output_tokens: int
    hard: bool
    jobs: list[Job] = field(default_factory=list)
    winner: Job | None = None
    ttft: float | None = None
    tpot: float | None = None
    e2e: float | None = None
    hedged: bool = False
    fallbacks: int = 0
    failed: bool = False


@dataclass(eq=False)
class Job:
    req: SimRequest
    rtt: float  # router <-> this instance, seconds
    instance: Instance | None = None
    state: Literal["new", "waiting", "prefill_q", "prefill", "decode", "done"] = "new"
    cancelled: bool = False
    first_token: float | None = None
    done: float | None = None
