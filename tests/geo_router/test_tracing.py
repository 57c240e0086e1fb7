"""The router's spans when a request does not go straight through: a mid-stream
continuation, a hedge, a failover. Real sockets, fake upstreams that keep the
headers they were sent, an OTLP receiver decoding what the router exports."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from typing import Any

from geo_router.app import create_app
from hybrid_llm.local.servers import UvicornThread
from servekit.http_protocol import HeadWithBodyProtocol
from servekit.registry.protocol import InstanceState
from tests.geo_router.conftest import refused_url, router_settings, serve_fake
from tests.geo_router.fake_upstream import Behavior
from tests.geo_router.test_failover import chat, read_stream, state, text_of
from tests.support.otlp import OtlpReceiver, ReceivedSpan


@contextmanager
def traced(states: list[InstanceState], **routing: Any) -> Iterator[tuple[str, OtlpReceiver]]:
    with OtlpReceiver() as receiver:
        tracing = {"enabled": True, "endpoint": receiver.endpoint, "export_delay_ms": 50}
        routing = {"ttft_deadline_s": 1.0, "slow_start_s": 0, **routing}
        settings = router_settings([], routing=routing, tracing=tracing)
        app = create_app(settings, candidates=lambda: states)
        with UvicornThread(app, http=HeadWithBodyProtocol) as server:
            yield server.url, receiver


def _spans(receiver: OtlpReceiver, attempts: int) -> dict[str, list[ReceivedSpan]]:
    def arrived(spans: list[ReceivedSpan]) -> bool:
        names = [s.name for s in spans]
        return "router.request" in names and names.count("router.attempt") == attempts

    by_name: dict[str, list[ReceivedSpan]] = {}
    for s in receiver.wait_for(arrived):
        by_name.setdefault(s.name, []).append(s)
    assert len({s.trace_id for spans in by_name.values() for s in spans}) == 1
    return by_name


def _sent_parent(behavior: Behavior) -> str:
    """The span id in the traceparent an upstream received."""
    return str(behavior.seen[0]["headers"]["traceparent"].split("-")[2])


def test_a_continuation_is_a_second_attempt_under_the_same_request() -> None:
    dying, rescue = Behavior(words=8, die_after=3, token_delay_s=0.01), Behavior(words=8)
    with ExitStack() as stack:
        a, b = stack.enter_context(serve_fake(dying)), stack.enter_context(serve_fake(rescue))
        states = [state(a, "dies"), state(b, "rescue", region="west")]
        url, receiver = stack.enter_context(traced(states))
        _, events = read_stream(url, chat(max_tokens=100))
        assert text_of(events) == "w0 w1 w2 w3 w4 w5 w6 w7"
        spans = _spans(receiver, attempts=2)
    (request,) = spans["router.request"]
    assert request.attributes["route.continuations"] == 1
    first, second = sorted(spans["router.attempt"], key=lambda s: s.start_ns)
    assert (first.attributes["route.instance"], first.attributes["attempt.outcome"]) == (
        "dies",
        "broke",
    )
    assert (second.attributes["route.instance"], second.attributes["attempt.outcome"]) == (
        "rescue",
        "ok",
    )
    assert first.parent_id == second.parent_id == request.span_id
    # Each upstream was told its own attempt is its parent.
    assert (_sent_parent(dying), _sent_parent(rescue)) == (first.span_id, second.span_id)
    (continuation,) = spans["router.continuation"]
    assert continuation.parent_id == request.span_id
    assert continuation.attributes["continuation.outcome"] == "ok"
    assert continuation.attributes["continuation.tokens_before"] == 3


def test_a_hedge_is_marked_and_the_loser_abandoned() -> None:
    slow, fast = Behavior(first_token_delay_s=3, words=2), Behavior(words=2)
    with ExitStack() as stack:
        a, b = stack.enter_context(serve_fake(slow)), stack.enter_context(serve_fake(fast))
        states = [state(a, "slow"), state(b, "fast", region="west")]
        hedge = {"enabled": True, "min_delay_ms": 100, "default_delay_ms": 100}
        url, receiver = stack.enter_context(traced(states, hedge=hedge, ttft_deadline_s=5))
        headers, _ = read_stream(url, chat())
        assert headers["x-route-reason"] == "hedge"
        spans = _spans(receiver, attempts=2)
    by_instance = {s.attributes["route.instance"]: s for s in spans["router.attempt"]}
    assert by_instance["slow"].attributes["attempt.hedge"] is False
    assert by_instance["slow"].attributes["attempt.outcome"] == "abandoned"
    assert by_instance["fast"].attributes["attempt.hedge"] is True
    assert by_instance["fast"].attributes["attempt.won"] is True
    assert "first_token" in by_instance["fast"].events
    assert spans["router.request"][0].attributes["route.reason"] == "hedge"


def test_a_failed_attempt_says_why() -> None:
    with serve_fake(Behavior(words=2)) as center:
        states = [state(refused_url(), "dead-edge"), state(center, "c", "center", "center")]
        with traced(states) as (url, receiver):
            headers, _ = read_stream(url, chat())
            assert headers["x-route-reason"] == "fallback"
            spans = _spans(receiver, attempts=2)
    by_instance = {s.attributes["route.instance"]: s for s in spans["router.attempt"]}
    dead = by_instance["dead-edge"]
    assert dead.attributes["attempt.outcome"] == "unavailable"
    assert dead.error
    assert by_instance["c"].attributes["attempt.outcome"] == "ok"
    assert not by_instance["c"].error
