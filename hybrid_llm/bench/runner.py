"""Load schedules: stepped concurrency (closed loop) or a Poisson request rate
(open loop), each step run for a bounded time and request count, once per
variant (a named set of extra headers, e.g. to pin a tier) so variants are
compared at the same offered load in one run.

The unit of work is a conversation: its turns go one after another, each
with the previous answers in its history, as a chat client sends them. A
closed-loop worker runs conversations back to back; an open-loop arrival
starts one. A failed turn ends its conversation; after a refusal that says
when to come back (429 or 503 with ``Retry-After``) a closed-loop worker
waits that long (at most ``max_backoff_s``) before starting the next, as a
client that honours it would.
"""

from __future__ import annotations

import asyncio
import random
import time
from dataclasses import dataclass, field
from typing import Any, Literal

import httpx

from hybrid_llm.bench.client import RequestRecord, send_streaming
from hybrid_llm.bench.conversations import Conversation
from hybrid_llm.bench.workload import Source

__all__ = ["LoadStep", "RunPlan", "StepRun", "Variant", "run_plan"]

Mode = Literal["concurrency", "rate"]


@dataclass(frozen=True)
class LoadStep:
    mode: Mode
    value: float

    @property
    def label(self) -> str:
        return f"c={self.value:g}" if self.mode == "concurrency" else f"rate={self.value:g}/s"


@dataclass(frozen=True)
class Variant:
    """A named way of sending the same load: extra headers, another ``model``."""

    name: str
    headers: dict[str, str] = field(default_factory=dict)
    model: str | None = None

    def apply(self, body: dict[str, Any]) -> dict[str, Any]:
        if self.model is not None:
            body["model"] = self.model
        return body


@dataclass
class StepRun:
    step: LoadStep
    variant: str
    wall: float
    records: list[RequestRecord]


@dataclass
class RunPlan:
    url: str  # where requests go; with ``more_urls``, the first of several routers
    workload: Source
    steps: list[LoadStep]
    variants: list[Variant]
    duration: float = 10.0
    max_requests: int = 200
    warmup: int = 0  # requests per variant before measuring, not recorded
    warmup_concurrency: int = 1
    api_key: str | None = None
    timeout: float = 120.0
    max_in_flight: int = 1024
    seed: int = 0
    max_backoff_s: float = 5.0  # longest Retry-After a closed-loop worker honours
    # Further routers behind the same fleet: requests take turns over ``url`` and
    # these (every request, not every conversation: a load balancer spreads turns).
    more_urls: tuple[str, ...] = ()
    sent: int = 0  # requests sent so far (the turn taker's counter)

    def target(self) -> str:
        """Where the next request goes: the workload's path, on the next router in turn."""
        if not self.more_urls:
            return self.workload.path
        urls = (self.url, *self.more_urls)
        turn, self.sent = self.sent, self.sent + 1
        return urls[turn % len(urls)] + self.workload.path


class _Budget:
    """Requests a step may still send before its deadline."""

    def __init__(self, plan: RunPlan) -> None:
        self.left = plan.max_requests
        self.deadline = time.perf_counter() + plan.duration

    def take(self) -> bool:
        if self.left <= 0 or time.perf_counter() >= self.deadline:
            return False
        self.left -= 1
        return True


async def _converse(
    client: httpx.AsyncClient,
    plan: RunPlan,
    variant: Variant,
    conv: Conversation,
    t0: float,
    budget: _Budget | None,
    records: list[RequestRecord],
) -> RequestRecord | None:
    """Send ``conv``'s turns in order; the last record (``None`` if none was sent)."""
    history = list(conv.prefix)
    last: RequestRecord | None = None
    for turn, text in enumerate(conv.turns):
        if budget is not None and turn > 0 and not budget.take():
            break
        messages = [*history, {"role": "user", "content": text}]
        body = variant.apply(plan.workload.request_body(messages, conv.max_tokens))
        answer: list[str] = []
        last = await send_streaming(
            client,
            plan.target(),
            body,
            bucket=conv.label,
            run_start=t0,
            headers=variant.headers,
            answer=answer,
            turn=turn,
        )
        records.append(last)
        if not last.ok:
            break
        history = [*messages, {"role": "assistant", "content": "".join(answer)}]
    return last


async def _closed_loop(
    client: httpx.AsyncClient, plan: RunPlan, variant: Variant, concurrency: int, t0: float
) -> list[RequestRecord]:
    records: list[RequestRecord] = []
    budget = _Budget(plan)

    async def worker() -> None:
        while budget.take():
            conv = plan.workload.conversation()
            last = await _converse(client, plan, variant, conv, t0, budget, records)
            if last is not None and last.retry_after is not None:
                wait = min(plan.max_backoff_s, last.retry_after)
                await asyncio.sleep(max(0.0, min(wait, budget.deadline - time.perf_counter())))

    async with asyncio.TaskGroup() as tg:
        for _ in range(concurrency):
            tg.create_task(worker())
    return records


async def _open_loop(
    client: httpx.AsyncClient,
    plan: RunPlan,
    variant: Variant,
    rate: float,
    t0: float,
    rng: random.Random,
) -> list[RequestRecord]:
    records: list[RequestRecord] = []
    gate = asyncio.Semaphore(plan.max_in_flight)
    deadline = time.perf_counter() + plan.duration

    async def one(conv: Conversation) -> None:
        try:
            await _converse(client, plan, variant, conv, t0, None, records)
        finally:
            gate.release()

    async with asyncio.TaskGroup() as tg:
        next_at = time.perf_counter()
        for _ in range(plan.max_requests):
            next_at += rng.expovariate(rate)
            if next_at >= deadline:
                break
            await asyncio.sleep(max(0.0, next_at - time.perf_counter()))
            await gate.acquire()
            tg.create_task(one(plan.workload.conversation()))
    return records


async def run_plan(plan: RunPlan, progress: object = None) -> list[StepRun]:
    """Run every step for every variant; return what each measured."""
    headers = {"Authorization": f"Bearer {plan.api_key}"} if plan.api_key else {}
    limits = httpx.Limits(max_connections=plan.max_in_flight, max_keepalive_connections=256)
    runs: list[StepRun] = []
    async with httpx.AsyncClient(
        base_url=plan.url, headers=headers, timeout=plan.timeout, limits=limits
    ) as client:
        t0 = time.perf_counter()
        if plan.warmup:
            # Every variant warms its own path (pooled connections, engine slots'
            # prefix caches), so none is measured cold while another is warm.
            warm = RunPlan(**{**plan.__dict__, "max_requests": plan.warmup, "duration": 1e9})
            for variant in plan.variants:
                await _closed_loop(client, warm, variant, plan.warmup_concurrency, t0)
        for index, step in enumerate(plan.steps):
            for variant in plan.variants:
                # Every variant of a step gets the same arrival times: same offered load.
                rng = random.Random(plan.seed * 1000 + index)
                started = time.perf_counter()
                if step.mode == "concurrency":
                    records = await _closed_loop(client, plan, variant, int(step.value), t0)
                else:
                    records = await _open_loop(client, plan, variant, step.value, t0, rng)
                wall = time.perf_counter() - started
                runs.append(StepRun(step, variant.name, wall, records))
                if callable(progress):
                    progress(runs[-1])
    return runs
