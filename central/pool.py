"""The replica pool: many engine replicas behind one :class:`Engine`.

The pool is what the shared serving layer sees as "the engine". Its
``generate`` picks a healthy replica with the balancer and delegates to that
replica's engine; if the replica fails *before its first event* (connection
refused, a 5xx, its queue full) the same request goes to another replica, so
a replica dying between health probes costs the client nothing. That part is
the router's dispatch loop (:mod:`servekit.dispatch`) with the balancer as
the order and a wait of up to ``dispatch_wait_s`` for a replica to come back
when none is left to try. A replica
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
import math
import time
from collections.abc import AsyncIterator, Callable
from typing import Any

from central.balancer import Balancer, prefix_key
from central.continuation import continuation, merged_finish
from central.replica import EngineFactory, Replica
from central.scrape import ReplicaProbe
from central.settings import CentralSettings
from servekit.dispatch import first_primed
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
    UpstreamTimeout,
    UpstreamUnavailable,
)
from servekit.peers import async_client

__all__ = ["ReplicaPool"]

log = logging.getLogger(__name__)

_clock = time.monotonic  # the dispatch loop's, and the wait for a replica's


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

    @property
    def dispatch_wait_s(self) -> float:
        """How long a request waits for a replica to come back when none is left."""
        return self._wait_s

    @property
    def shed_backoff_s(self) -> float:
        """How long a replica that refused without ``Retry-After`` ranks last."""
        return self._settings.balancing.shed_backoff_s

    def choose(self, replicas: list[Replica], key: str | None) -> Replica | None:
        """The balancer's pick among ``replicas`` for a request of prefix ``key``."""
        chosen = self._balancer.choose([r.candidate() for r in replicas], key)
        return None if chosen is None else self._by_name[chosen.name]

    async def changed(self, timeout_s: float) -> None:
        """Until a replica changes state (came back, left, restarted) or ``timeout_s``."""
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._changed.wait(), timeout_s)

    def _replica_changed(self) -> None:
        self._changed.set()
        self._changed = asyncio.Event()
        self._on_capacity(max(1, self.healthy_capacity))

    async def _generate(self, request: GenerationRequest) -> AsyncIterator[GenerationEvent]:
        balancing = self._settings.balancing
        key = prefix_key(request, balancing.prefix_chars) if balancing.prefix_affinity else None
        replicas = _Replicas(self, request, key)
        partial: list[str] = []
        produced = 0  # tokens the client has been sent
        carried = 0  # of which the current attempt was given as its prompt's end
        while True:
            attempt, _ = await first_primed(replicas, clock=_clock)
            try:
                event = attempt.first
                while event is not None:
                    if isinstance(event, Finish):
                        yield merged_finish(event, carried) if carried else event
                        return
                    partial.append(event.text)
                    produced += event.tokens
                    yield event
                    event = await anext(attempt.events, None)
                name = attempt.replica.name
                raise EngineFailure(f"replica {name} ended a stream without finishing")
            except ServeError as exc:
                replicas.failed(attempt, attempt.failed(exc))  # raises when not retryable
                name, why = attempt.replica.name, exc.message
                log.warning("request %s broke on %s after %d tokens (%s); continuing elsewhere",
                            request.request_id, name, produced, why)  # fmt: skip
            finally:
                await attempt.abandon()  # a no-op for an attempt already judged
            resumed = continuation(request, "".join(partial), produced)
            if resumed is None:
                yield Finish("length", 0, produced)
                return
            replicas.resume(resumed)
            carried = produced


class _ReplicaAttempt:
    """One try at one replica (:class:`servekit.dispatch.Attempt`): its in-flight
    count from creation until its one verdict. Primed at its first event; no
    first-token deadline (each engine bounds its own)."""

    __slots__ = ("_ended", "_shed_backoff_s", "events", "first", "replica", "started")

    deadline = math.inf

    def __init__(self, replica: Replica, request: GenerationRequest, shed_backoff_s: float) -> None:
        self.replica = replica
        self._shed_backoff_s = shed_backoff_s
        self.started = _clock()
        replica.inflight += 1
        self.events = measured(
            replica.engine.generate(_for_replica(request, replica)), replica.rates
        )
        self.first: GenerationEvent | None = None
        self._ended = False

    async def prime(self) -> None:
        try:
            self.first = await anext(self.events, None)
            if self.first is None:
                name = self.replica.name
                raise EngineFailure(f"replica {name} ended a stream without finishing")
        except BaseException:
            await _aclose(self.events)  # the verdict is failed()'s or abandon()'s
            raise
        self.replica.served += 1

    def failed(self, exc: BaseException) -> ServeError:
        """Its error when another replica may try; raised when none would answer
        differently. An unreachable replica leaves the rotation until its probe; one that
        refused (429) ranks last for its ``Retry-After``."""
        self._release()
        if not isinstance(exc, ServeError) or not exc.retryable:
            raise exc
        if isinstance(exc, UpstreamUnavailable):
            self.replica.mark_unreachable(exc.message)
        elif isinstance(exc, RateLimited):
            wait = exc.retry_after
            self.replica.refused(self._shed_backoff_s if wait is None else wait)
        return exc

    def missed(self) -> ServeError:
        return self.failed(UpstreamTimeout(f"replica {self.replica.name}: no first event"))

    async def abandon(self) -> None:
        if self._release():
            await _aclose(self.events)

    def _release(self) -> bool:
        if self._ended:
            return False
        self._ended = True
        self.replica.inflight -= 1
        return True


class _Replicas:
    """The pool's candidates (:class:`servekit.dispatch.Candidates`): the balancer's
    choice among the healthy replicas not tried yet; while none is left, a wait of up to
    ``dispatch_wait_s`` (from the request's arrival) for one to come back. A
    continuation goes only to replicas that can continue a final message, and does not
    wait."""

    def __init__(self, pool: ReplicaPool, request: GenerationRequest, key: str | None) -> None:
        self._pool = pool
        self._request = request
        self._key = key
        self._wait_until = _clock() + pool.dispatch_wait_s
        self._shed_backoff_s = pool.shed_backoff_s
        self._tried: set[str] = set()
        self._last_error: ServeError | None = None
        self._resuming = False

    def resume(self, request: GenerationRequest) -> None:
        """From now on, continue the answer with ``request``."""
        self._request, self._resuming = request, True

    def _untried(self) -> list[Replica]:
        tried, resuming = self._tried, self._resuming
        return [
            r
            for r in self._pool.replicas
            if r.healthy and r.name not in tried and (r.endpoint.can_continue or not resuming)
        ]

    def more(self) -> bool:
        return bool(self._untried())

    async def next(self, *, hedge: bool) -> _ReplicaAttempt:
        pool, last_error = self._pool, self._last_error
        while True:
            chosen = pool.choose(self._untried(), self._key)
            if chosen is not None:
                return _ReplicaAttempt(chosen, self._request, self._shed_backoff_s)
            if last_error is not None and (
                self._resuming or len(self._tried) >= len(pool.replicas)
            ):
                raise _blame(last_error)
            left = self._wait_until - _clock()
            if left <= 0:
                if last_error is not None:
                    raise _blame(last_error)
                raise NotReady("no healthy replica", retry_after=2)
            await pool.changed(left)  # a replica may come back (or be restarted)

    def failed(self, attempt: _ReplicaAttempt, err: ServeError) -> None:
        self._tried.add(attempt.replica.name)
        self._last_error = err
        self._pool.retries += 1
        log.info("request %s failed on %s before its first event (%s); retrying",
                 self._request.request_id, attempt.replica.name, err.message)  # fmt: skip


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
