"""Routing policies: the seam between the simulator and the routing code.

A policy sees the request and the fleet and returns the ordered candidates:
the first is dispatched, the next one is where a 429 falls back to and what a
hedge races. Candidate scoring is one function, :data:`Scorer`; the hybrid
policies take it as an argument so the router's own scoring plugs in.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Literal, Protocol

from hybrid_llm.geography import RttTable
from hybrid_llm.sim.instance import Instance, LoadView
from hybrid_llm.sim.request import Job, SimRequest

__all__ = [
    "AllToCenter",
    "CenterPool",
    "Fleet",
    "Hybrid",
    "Policy",
    "Scorer",
    "Target",
    "predict_ttft_s",
]


class Target(Protocol):
    """Something a request can be sent to: an edge instance or the center gateway."""

    @property
    def name(self) -> str: ...

    @property
    def tier(self) -> Literal["edge", "center"]: ...

    @property
    def region(self) -> str: ...

    def load(self) -> LoadView: ...

    def submit(self, job: Job) -> bool: ...


class CenterPool:
    """The central gateway: one target in front of replicas, least-loaded first."""

    tier: Literal["edge", "center"] = "center"

    def __init__(self, region: str, replicas: Sequence[Instance]) -> None:
        self.name = f"center/{region}"
        self.region = region
        self.replicas = list(replicas)

    def load(self) -> LoadView:
        first = self.replicas[0]
        waiting = running = 0
        for r in self.replicas:
            waiting += r.backlog
            running += r.active
        return LoadView(
            waiting=waiting,
            running=running,
            capacity=first.profile.slots * len(self.replicas),
            queue_limit=first.profile.queue_limit * len(self.replicas),
            prefill_tokens_per_s=first.profile.prefill_tokens_per_s,  # one request, one replica
            decode_step_s=first.load().decode_step_s,
        )

    def submit(self, job: Job) -> bool:
        replica = min(self.replicas, key=lambda r: r.used + len(r.waiting))
        return replica.submit(job)


@dataclass
class Fleet:
    edges: dict[str, list[Instance]]
    center: CenterPool
    rtt: RttTable

    def __post_init__(self) -> None:
        self._others = {
            region: [e for r, edges in self.edges.items() if r != region for e in edges]
            for region in self.edges
        }

    def rtt_s(self, a: str, b: str) -> float:
        return self.rtt.rtt(a, b) / 1000.0

    def sample_edges(self, region: str, k: int, rng: random.Random) -> list[Instance]:
        """Up to ``k`` random edges of ``region`` and ``k`` of the other regions.

        A router scores every healthy edge; sampling keeps the simulator's cost
        per request constant on a thousand-edge fleet. Remote edges carry their
        RTT in the score, so they win only when the local ones are busy.
        """
        local = self.edges.get(region, [])
        others = self._others.get(region, [])
        out = rng.sample(local, k) if len(local) > k else list(local)
        out += rng.sample(others, k) if len(others) > k else others
        return out


# predicted TTFT (s) for a candidate: (load, rtt_s, prompt_tokens, mean output tokens)
Scorer = Callable[[LoadView, float, int, float], float]


def predict_ttft_s(load: LoadView, rtt_s: float, prompt_tokens: int, mean_output: float) -> float:
    """RTT + queue wait from the reported load + prefill, as the design's router scores.

    Queue wait: requests ahead of this one beyond free slots, each holding a slot
    for about one prefill plus ``mean_output`` decode steps, spread over the slots.
    """
    prefill = prompt_tokens / load.prefill_tokens_per_s
    ahead = load.waiting + max(0, load.running - load.capacity + 1)
    service = prefill + mean_output * load.decode_step_s
    wait = ahead * service / load.capacity
    return rtt_s + wait + prefill


class Policy(Protocol):
    """Chooses where a request goes; ``hedge_after_s`` None means never hedge."""

    hedge_after_s: float | None

    def candidates(self, req: SimRequest, fleet: Fleet) -> list[Target]: ...


class AllToCenter:
    hedge_after_s: float | None = None

    def candidates(self, req: SimRequest, fleet: Fleet) -> list[Target]:
        return [fleet.center]


class Hybrid:
    """Hard requests to the center; simple ones to the best of ``choices`` random
    same-region edges (and as many from other regions) by predicted TTFT, the
    center after them as the fallback.
    The center goes first only when the best edge is predicted slower than the
    center by more than ``spill_s`` (edges saturated). The runner-up is what a
    429 falls back to and what a hedge (``hedge_after_s``) races."""

    def __init__(
        self,
        rng: random.Random,
        mean_output: float,
        *,
        choices: int = 2,
        hedge_after_s: float | None = None,
        spill_s: float = 0.1,
        scorer: Scorer = predict_ttft_s,
    ) -> None:
        self.rng = rng
        self.mean_output = mean_output
        self.choices = choices
        self.hedge_after_s = hedge_after_s
        self.spill_s = spill_s
        self.scorer = scorer

    def candidates(self, req: SimRequest, fleet: Fleet) -> list[Target]:
        center: Target = fleet.center
        if req.hard:
            return [center]
        scored: list[tuple[float, Target]] = []
        for edge in fleet.sample_edges(req.region, self.choices, self.rng):
            load = edge.load()
            if load.waiting >= load.queue_limit:
                continue  # it would answer 429; the router skips it
            rtt = fleet.rtt_s(req.region, edge.region)
            scored.append((self.scorer(load, rtt, req.prompt_tokens, self.mean_output), edge))
        if not scored:
            return [center]
        scored.sort(key=lambda pair: pair[0])
        ordered = [t for _, t in scored]
        rtt = fleet.rtt_s(req.region, center.region)
        center_s = self.scorer(center.load(), rtt, req.prompt_tokens, self.mean_output)
        if scored[0][0] > center_s + self.spill_s:
            return [center, *ordered]
        return [*ordered, center]
