"""The network between the simulated router and its instances, as a ``servekit`` transport.

:class:`SimTransport` is a :class:`servekit.transport.Transport`: the router's own
dispatcher (``geo_router.dispatch``, its :class:`~geo_router.attempt.Attempt`)
posts to it as to the lean pool, on the simulation's virtual clock. A post
names its instance by URL (:func:`~hybrid_llm.fleet.sim.policy.instance_info`)
and its request by the :data:`REQUEST_HEADER` the simulation sets:

* the request reaches the instance half the RTT later and is submitted
  there; a full instance refuses it with the 429 an edge's admission sends
  (``queue_full``, ``Retry-After: 1``, the least it sends), heard half an RTT
  later;
* an admitted one answers 200, heard half an RTT after admission; its
  first-token event and its end (``finish_reason`` and ``[DONE]``) arrive
  half an RTT after the instance produced them;
* closing a response that has not ended (a lost hedge, an attempt cut at its
  deadline, a client gone) aborts the job there half an RTT later; so does
  a post cancelled after the instance admitted it. A post cancelled before
  it arrived never runs (its abort follows it on the same path).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from typing import Literal

from hybrid_llm.fleet.sim.events import EventLoop
from hybrid_llm.fleet.sim.policy import Fleet, Target, instance_info
from hybrid_llm.fleet.sim.request import Job, SimRequest
from servekit.peers import PeerCredentials

__all__ = ["REQUEST_HEADER", "SimResponse", "SimTransport"]

REQUEST_HEADER = "x-sim-request"  # which SimRequest a post carries (its id)

_TOKEN = b'data: {"choices":[{"index":0,"delta":{"content":"x"}}]}\n\n'
_END = b'data: {"choices":[{"index":0,"delta":{},"finish_reason":"stop"}]}\n\ndata: [DONE]\n\n'
_QUEUE_FULL = b'{"error":{"message":"queue full","type":"rate_limit_error","code":"queue_full"}}'


class SimResponse:
    """One instance's answer as the router reads it."""

    def __init__(
        self,
        status: int,
        job: Job,
        headers: Mapping[str, str],
        body: bytes = b"",
        abort: Callable[[Job], None] = lambda _job: None,
    ) -> None:
        self.status = status
        self.headers = headers
        self.job = job
        self._body = body
        self._abort = abort
        self._events: asyncio.Queue[bytes | None] = asyncio.Queue()  # None: no more

    def arrive(self, chunk: bytes | None) -> None:
        """A chunk reached the router (``None``: the connection's end)."""
        self._events.put_nowait(chunk)

    async def chunks(self) -> AsyncIterator[bytes]:
        while (chunk := await self._events.get()) is not None:
            yield chunk

    async def read(self) -> bytes:
        return self._body

    def flowing(self) -> None:
        return None

    def release(self) -> None:
        self.job.released = True

    def close(self) -> None:
        self.job.released = True
        self._abort(self.job)


class SimTransport:
    """Posts from the router to the simulated instances (see the module's docstring)."""

    def __init__(self, loop: EventLoop, fleet: Fleet, requests: Sequence[SimRequest]) -> None:
        self._loop = loop
        self._fleet = fleet
        self._requests = requests
        targets: list[Target] = [e for edges in fleet.edges.values() for e in edges]
        targets.append(fleet.center)
        self._targets = {instance_info(t, 0).url: t for t in targets}
        self._streams: dict[Job, SimResponse] = {}

    async def post(
        self,
        url: str,
        payload: bytes,
        headers: Mapping[str, str],
        peer: PeerCredentials | None = None,
    ) -> SimResponse:
        req = self._requests[int(headers[REQUEST_HEADER])]
        target = self._targets[url[: url.index("/", len("http://"))]]
        # Another copy still open at the router: this one is a hedge; else a fallback.
        if any(not j.released for j in req.jobs):
            req.hedged = True
        elif req.jobs:
            req.fallbacks += 1
        rtt = self._fleet.rtt_s(req.region, target.region)
        job = Job(req, rtt, target=target, sent=self._loop.now)
        req.jobs.append(job)
        try:
            await asyncio.sleep(rtt / 2)
        except asyncio.CancelledError:
            job.state, job.released = "done", True
            raise
        if not target.submit(job):
            job.state = "done"
            refused = SimResponse(429, job, {"retry-after": "1"}, _QUEUE_FULL)
            await asyncio.sleep(rtt / 2)
            return refused
        response = SimResponse(200, job, {}, abort=self._abort)
        self._streams[job] = response
        try:
            await asyncio.sleep(rtt / 2)
        except asyncio.CancelledError:
            response.close()
            raise
        return response

    def heard(self, job: Job, what: Literal["first_token", "done"]) -> None:
        """The instance produced ``job``'s first token or its end: on its way back."""
        response = self._streams.get(job)
        if response is None:
            return
        after = self._loop.after
        if what == "first_token":
            after(job.rtt / 2, response.arrive, _TOKEN)
        else:
            del self._streams[job]
            after(job.rtt / 2, response.arrive, _END)
            after(job.rtt / 2, response.arrive, None)

    def _abort(self, job: Job) -> None:
        self._streams.pop(job, None)
        inst = job.instance
        if inst is not None and job.state != "done":
            self._loop.after(job.rtt / 2, inst.cancel, job)  # the abort travels one way

    async def close(self) -> None:
        return None
