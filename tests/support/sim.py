"""What the simulator's engine tests share: a recorder of first tokens and ends, and a job."""

from __future__ import annotations

from hybrid_llm.fleet.sim.request import Job, SimRequest


class Recorder:
    """The simulated instance's listener: when each request's first token and end came."""

    def __init__(self) -> None:
        self.first: dict[int, float] = {}
        self.finished: dict[int, float] = {}

    def first_token(self, job: Job, now: float) -> None:
        self.first[job.req.id] = now

    def done(self, job: Job, now: float) -> None:
        self.finished[job.req.id] = now


def sim_job(i: int, prompt: int = 100, output: int = 11) -> Job:
    """Request ``i`` from region ``a`` at time 0, an easy one, no RTT."""
    return Job(SimRequest(i, "a", 0.0, prompt, output, False), rtt=0.0)
