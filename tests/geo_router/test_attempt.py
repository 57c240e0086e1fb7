"""An attempt acquires, judges and releases its instance exactly once, through a fake transport."""

from __future__ import annotations

import asyncio
import time

import pytest

from geo_router.attempt import Attempt, Routing
from geo_router.dispatch import first_primed
from geo_router.metrics import RouterMetrics
from geo_router.region import ResolvedRegion
from geo_router.request import RouteRequest
from geo_router.routing_settings import BreakerSettings, RoutingSettings
from geo_router.scoring import Scored
from geo_router.tracker import Circuit, Tracker
from servekit.engine.protocol import LoadReport
from servekit.errors import RateLimited, UpstreamError
from servekit.registry.protocol import InstanceInfo, InstanceState
from tests.support.transport import FakeResponse, FakeTransport

TOKEN = b'data: {"choices":[{"index":0,"delta":{"content":"hi"}}]}\n\n'


def cand(iid: str) -> Scored:
    info = InstanceInfo(iid, "edge", "east", "127.0.0.1", 9, "m")
    state = InstanceState(info, LoadReport(ready=True, capacity=4), True, time.time())
    return Scored(state, 10.0, 0.0, 0.0, 0.0, 0.0, 0.0, 1.0, Circuit.CLOSED)


def routing(transport: FakeTransport, **settings: object) -> Routing:
    return Routing(
        transport,
        Tracker(BreakerSettings(failures=1)),
        RouterMetrics(),
        RoutingSettings.model_validate(settings),
    )


REQ = RouteRequest(
    {"model": "auto", "messages": [{"role": "user", "content": "x"}], "stream": False},
    "chat",
    "/v1/chat/completions",
    ResolvedRegion("east", "default", None),
    "u",
    {},
    0.0,
)


def test_every_verdict_after_the_first_is_a_no_op() -> None:
    async def run() -> None:
        done = FakeResponse(200, [TOKEN, b"data: [DONE]\n\n"], {})
        r = routing(FakeTransport(done))
        attempt = Attempt(r, REQ, cand("a"), 0)
        stats = r.tracker.stats("a")
        assert stats.inflight == 1
        await attempt.prime()
        attempt.won()
        assert [c async for c in attempt.relay()] == [b"data: [DONE]\n\n"]
        await attempt.finished()
        await attempt.broke()  # too late: judged already
        await attempt.abandon()
        assert attempt.failed(UpstreamError("late")).message == "late"
        assert (stats.inflight, len(stats.released), stats.failures) == (0, 1, 0)
        assert stats.circuit is Circuit.CLOSED
        assert (done.released, done.closed) == (1, 0)

    asyncio.run(run())


def test_a_429s_retry_after_is_the_back_off_and_the_next_candidate_answers() -> None:
    async def run() -> None:
        busy = FakeResponse(429, [b'{"error":{"message":"busy"}}'], {"retry-after": "30"})
        ok = FakeResponse(200, [TOKEN], {})
        transport = FakeTransport(busy, ok)
        r = routing(transport, shed_backoff_s=0.0)
        attempt, hedged = await first_primed(r, REQ, [cand("a"), cand("b")], hedge=False)
        assert (attempt.cand.id, hedged) == ("b", False)
        # Only a stream whose first token arrived is timed for silence from then on.
        assert (busy.flowed, ok.flowed) == (False, True)
        assert r.tracker.stats("a").refused_until > time.monotonic() + 25
        assert r.tracker.stats("a").inflight == 0
        assert transport.sent[0]["stream"] is True  # always streamed upstream
        assert transport.sent[0]["stream_options"] == {"include_usage": True}
        await attempt.abandon()
        assert r.tracker.stats("b").inflight == 0

    asyncio.run(run())


def test_the_last_candidates_refusal_reaches_the_client() -> None:
    async def run() -> None:
        busy = FakeResponse(429, [b"{}"], {"retry-after": "3"})
        r = routing(FakeTransport(busy))
        with pytest.raises(RateLimited) as caught:
            await first_primed(r, REQ, [cand("a")], hedge=False)
        assert caught.value.retry_after == 3

    asyncio.run(run())
