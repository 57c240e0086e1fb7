"""The replica pool: many engine replicas behind one :class:`Engine`.

The pool is what the shared serving layer sees as "the engine". Its
``generate`` picks a healthy replica with the balancer and delegates to that
replica's engine; if the replica fails *before its first event* (connection
refused, a 5xx, its queue full) the same request goes to another replica, so
a replica dying between health probes costs the client nothing; a replica
that refused (429) ranks last for its ``Retry-After`` (:mod:`central.balancer`),
so the next requests do not queue up behind the refusal. If it dies
*mid-answer*, the answer goes on from the partial text on another replica
that can continue a final message (:mod:`central.continuation`).

``load()`` aggregates the replicas; ``ready()`` is true while at least one
replica is healthy. ``start()`` launches and supervises the replicas but does
not wait for them (a 72B model takes minutes); ``/ready`` says when.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import time
from collections.abc import AsyncIterator, Callable
from typing import Any

from central.balancer import Balancer, prefix_key
from central.continuation import continuation, merged_finish
from central.replica import EngineFactory, Replica
from central.scrape import ReplicaProbe
from central.settings import CentralSettings
from servekit.engine.protocol import (
    Finish,
    GenerationEvent,
    GenerationRequest,
    LoadReport,
    Priority,
    pooled_figures,
)
from servekit.engine.rates import measured
from servekit.engine.vllm import with_vllm_priority
from servekit.errors import (
    EngineFailure,
    NotReady,
    RateLimited,
    ServeError,
    UpstreamRejected,
    UpstreamUnavailable,
)
from servekit.peers import async_client

__all__ = ["ReplicaPool"]

log = logging.getLogger(__name__)


class ReplicaPool:
    """An :class:`~servekit.engine.protocol.Engine` over supervised replicas."""

    def __init__(
        self,
        settings: CentralSettings,
        engine_factory: EngineFactory,
        *,
        on_capacity: Callable[[int], None] = lambda _slots: None,
    ) -> None:
        self._settings = settings
        client = settings.replica_client
        self._client = async_client(client)
        self._probe = ReplicaProbe(self._client, settings.supervision.probe_timeout_s)
        self._on_capacity = on_capacity
        self._wait_s = settings.supervision.dispatch_wait_s
        self._changed = asyncio.Event()
        traces = settings.engine_traces()
        self.replicas = [
            Replica(
                spec,
                model_name=settings.model,
                version=settings.version,
                supervision=settings.supervision,
                probe=self._probe,
                engine_factory=engine_factory,
                on_change=self._replica_changed,
                token=client.token.get_secret_value() if client.token is not None else None,
                traces=traces,
            )
            for spec in settings.replicas
        ]
        self._by_name = {r.name: r for r in self.replicas}
        self._balancer = Balancer(settings.balancing, [r.name for r in self.replicas])
        self._tasks: list[asyncio.Task[None]] = []
        self.retries = 0

    # -- Engine protocol ---------------------------------------------------

    @property
    def model_name(self) -> str:
        return self._settings.model

    @property
    def capacity(self) -> int:
        return sum(r.capacity for r in self.replicas)

    @property
    def healthy_capacity(self) -> int:
        return sum(r.capacity for r in self.replicas if r.healthy)

    async def start(self) -> None:
        if self._tasks:
            return
        self._settings.supervision.log_dir.mkdir(parents=True, exist_ok=True)
        for replica in self.replicas:
            task = asyncio.create_task(replica.run(), name=f"replica-{replica.name}")
            self._tasks.append(task)

    async def ready(self) -> bool:
        return any(r.healthy for r in self.replicas)

    def load(self) -> LoadReport:
        healthy = [r for r in self.replicas if r.healthy]
        reports = [r.report() for r in healthy]
        return dataclasses.replace(
            pooled_figures(reports, len(healthy)),
            ready=bool(healthy),
            waiting=sum(r.load.waiting for r in healthy if r.load),
            running=sum(r.inflight for r in self.replicas),
            capacity=sum(r.capacity for r in healthy),
            model=self.model_name,
            version=self._settings.version,
        )

    def generate(self, request: GenerationRequest) -> AsyncIterator[GenerationEvent]:
        return self._generate(request)

    async def aclose(self) -> None:
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        self._tasks.clear()
        await asyncio.gather(*(r.stop() for r in self.replicas), return_exceptions=True)
        for replica in self.replicas:
            with contextlib.suppress(Exception):
                await replica.engine.aclose()
        await self._client.aclose()

    # -- dispatch ----------------------------------------------------------

    def replica(self, name: str) -> Replica:
        return self._by_name[name]

    def status(self) -> list[dict[str, Any]]:
        return [r.status() for r in self.replicas]

    def _replica_changed(self) -> None:
        self._changed.set()
        self._changed = asyncio.Event()
        self._on_capacity(max(1, self.healthy_capacity))

    def _pick(self, key: str | None, tried: set[str], resuming: bool = False) -> Replica | None:
        candidates = [
            r.candidate()
            for r in self.replicas
            if r.healthy and r.name not in tried and (r.endpoint.can_continue or not resuming)
        ]
        chosen = self._balancer.choose(candidates, key)
        return None if chosen is None else self._by_name[chosen.name]

    async def _generate(self, request: GenerationRequest) -> AsyncIterator[GenerationEvent]:
        balancing = self._settings.balancing
        key = prefix_key(request, balancing.prefix_chars) if balancing.prefix_affinity else None
        tried: set[str] = set()
        last_error: ServeError | None = None
        deadline = time.monotonic() + self._wait_s
        current = request
        partial: list[str] = []
        produced = 0  # tokens the client has been sent
        carried = 0  # of which the current attempt was given as its prompt's end
        while True:
            resuming = bool(partial) or produced > 0
            replica = self._pick(key, tried, resuming)
            if replica is None:
                if last_error is not None and (resuming or len(tried) >= len(self.replicas)):
                    raise _blame(last_error)
                left = deadline - time.monotonic()
                if left <= 0:
                    if last_error is not None:
                        raise _blame(last_error)
                    raise NotReady("no healthy replica", retry_after=2)
                # A replica may come back (or be restarted) in a moment.
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._changed.wait(), left)
                continue
            replica.inflight += 1
            stream = replica.engine.generate(_for_replica(current, replica))
            events = measured(stream, replica.rates)
            started = False
            try:
                async for event in events:
                    if not started:
                        started = True
                        replica.served += 1
                    if isinstance(event, Finish):
                        yield merged_finish(event, carried) if carried else event
                        return
                    partial.append(event.text)
                    produced += event.tokens
                    yield event
                raise EngineFailure(f"replica {replica.name} ended a stream without finishing")
            except ServeError as exc:
                if not exc.retryable:
                    raise
                if isinstance(exc, UpstreamUnavailable):
                    replica.mark_unreachable(exc.message)
                elif isinstance(exc, RateLimited):
                    wait = exc.retry_after
                    replica.refused(balancing.shed_backoff_s if wait is None else wait)
                tried.add(replica.name)
                last_error = exc
                self.retries += 1
                if not (partial or produced):
                    log.info("request %s failed on %s before its first token (%s); retrying",
                             request.request_id, replica.name, exc.message)  # fmt: skip
                    continue
                log.warning("request %s broke on %s after %d tokens (%s); continuing elsewhere",
                            request.request_id, replica.name, produced, exc.message)  # fmt: skip
                resumed = continuation(request, "".join(partial), produced)
                if resumed is None:
                    yield Finish("length", 0, produced)
                    return
                current = resumed
                carried = produced
            finally:
                replica.inflight -= 1
                await _aclose(events)


def _blame(error: ServeError) -> ServeError:
    """What the client gets after the last try: a refusal no replica would take is the
    request's fault (its 400), not the engines'."""
    return error.rejection if isinstance(error, UpstreamRejected) else error


# TensorRT-LLM's executor: Request::kDefaultPriority = 0.5, a float in 0..1, higher first.
_TRTLLM_PRIORITY = {Priority.INTERACTIVE: 0.5, Priority.BATCH: 0.0}


def _for_replica(request: GenerationRequest, replica: Replica) -> GenerationRequest:
    """The request as this replica takes it: the engine's own priority field when it
    schedules by it (vLLM: an int, lower first; TensorRT-LLM: a float, higher first)."""
    endpoint = replica.endpoint
    if not endpoint.send_priority:
        return request
    if not endpoint.trtllm:
        return with_vllm_priority(request)
    priority = _TRTLLM_PRIORITY[request.priority]
    return dataclasses.replace(request, extra={**request.extra, "priority": priority})


async def _aclose(events: AsyncIterator[GenerationEvent]) -> None:
    close = getattr(events, "aclose", None)
    if close is not None:
        with contextlib.suppress(Exception):
            await close()
