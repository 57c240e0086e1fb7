"""Real-socket failover: the router (uvicorn) in front of deliberately failing upstreams.

Discovery goes through the router's candidate seam with an in-test catalog
that insists every upstream is healthy, so the data path has to find out.
"""

from __future__ import annotations

import dataclasses
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from typing import Any

import httpx
import pytest

from geo_router.app import create_app
from hybrid_llm.local.servers import REPO, UvicornThread, free_port, wait_ready
from servekit.engine.protocol import LoadReport
from servekit.http_protocol import HeadWithBodyProtocol
from servekit.registry.protocol import InstanceInfo, InstanceState
from tests.geo_router.conftest import KEY, refused_url, router_settings, serve_fake
from tests.geo_router.fake_upstream import Behavior
from tests.support.transport import unanswered_url

AUTH = {"Authorization": f"Bearer {KEY}"}


def state(
    url: str, iid: str, tier: str = "edge", region: str = "east", window: int | None = None
) -> InstanceState:
    port = int(url.rsplit(":", 1)[1])
    info = InstanceInfo(iid, tier, region, "127.0.0.1", port, "fake-model")  # type: ignore[arg-type]
    load = LoadReport(ready=True, capacity=4, max_context_tokens=window)
    return InstanceState(info, load, True, time.time())


@contextmanager
def routed(states: list[InstanceState], **routing: Any) -> Iterator[str]:
    settings = router_settings([], routing={"ttft_deadline_s": 1.0, "slow_start_s": 0, **routing})
    app = create_app(settings, candidates=lambda: states)
    with UvicornThread(app, http=HeadWithBodyProtocol) as server:
        yield server.url


def chat(stream: bool = True, **extra: Any) -> dict[str, Any]:
    body = {"model": "auto", "messages": [{"role": "user", "content": "hi"}], "stream": stream}
    return {**body, **extra}


def read_stream(url: str, body: dict[str, Any]) -> tuple[httpx.Headers, list[Any]]:
    with (
        httpx.Client(timeout=20) as c,
        c.stream("POST", url + "/v1/chat/completions", json=body, headers=AUTH) as r,
    ):
        assert r.status_code == 200, r.read()
        events = [
            line[6:] if line == "data: [DONE]" else json.loads(line[6:])
            for line in r.iter_lines()
            if line.startswith("data: ")
        ]
        return r.headers, events


def text_of(events: list[Any]) -> str:
    return "".join(
        e["choices"][0]["delta"].get("content") or ""
        for e in events
        if isinstance(e, dict) and e.get("choices")
    )


def metric(url: str, name: str) -> float:
    for line in httpx.get(url + "/metrics").text.splitlines():
        if line.startswith(name + " ") or (line.startswith(name + "{") and line.count(" ") == 1):
            return float(line.rsplit(" ", 1)[1])
    return 0.0


def test_connect_refused_falls_over_to_the_center() -> None:
    with serve_fake(Behavior(words=3)) as center:
        states = [state(refused_url(), "dead-edge"), state(center, "c", "center", "center")]
        with routed(states) as url:
            headers, events = read_stream(url, chat())
            assert text_of(events) == "w0 w1 w2"
            assert events[-1] == "[DONE]"
            assert (headers["x-route-instance"], headers["x-route-reason"]) == ("c", "fallback")
            assert metric(url, 'router_fallbacks_total{cause="unavailable",tier="edge"}') == 1


def test_500_and_429_fall_over_and_all_429_keeps_retry_after() -> None:
    e500, e429 = Behavior(status=500), Behavior(status=429, retry_after="7")
    with serve_fake(e500) as a, serve_fake(e429) as b, serve_fake(Behavior(words=2)) as ctr:
        states = [state(a, "a"), state(b, "b", region="west"), state(ctr, "c", "center", "x")]
        with routed(states, center_bias_ms=1000) as url:
            headers, events = read_stream(url, chat())
            assert headers["x-route-instance"] == "c"
            assert text_of(events) == "w0 w1"
            assert len(e500.seen) == len(e429.seen) == 1
        with routed([state(b, "b")]) as url:
            r = httpx.post(url + "/v1/chat/completions", json=chat(False), headers=AUTH)
            assert r.status_code == 429
            assert r.headers["retry-after"] == "7"


def test_after_a_refusal_the_next_instance_is_told_what_the_request_spent() -> None:
    """An edge refused it after it queued there; the next instance counts that time
    against its own TTFT budget (X-Waited-Ms), or it admits what then answers past
    it. A failure other than a refusal is hidden as before: nothing is sent."""
    late = Behavior(status=429, retry_after="1", refuse_after_s=0.3)
    broken, ok = Behavior(status=500), Behavior(words=2)
    with serve_fake(late) as a, serve_fake(broken) as b, serve_fake(ok) as ctr:
        states = [state(a, "a"), state(ctr, "c", "center", "x")]
        with routed(states, center_bias_ms=1000) as url:
            headers, _ = read_stream(url, chat())
            assert headers["x-route-instance"] == "c"
        assert "x-waited-ms" not in late.seen[0]["headers"]
        assert 300 <= int(ok.seen[-1]["headers"]["x-waited-ms"]) < 2000
        states = [state(b, "b"), state(ctr, "c", "center", "x")]
        with routed(states, center_bias_ms=1000) as url:
            headers, _ = read_stream(url, chat())
            assert headers["x-route-instance"] == "c"
        assert "x-waited-ms" not in ok.seen[-1]["headers"]


def test_a_shedding_edge_is_busy_not_broken_its_circuit_stays_closed() -> None:
    shedding = Behavior(status=429)  # no Retry-After: shed_backoff_s is the back-off
    with serve_fake(shedding) as a, serve_fake(Behavior(words=2)) as b:
        states = [state(a, "a"), state(b, "b", region="west")]
        body = chat(False, model="edge")
        with routed(states, breaker={"failures": 2}, shed_backoff_s=0.0) as url:
            for _ in range(4):
                r = httpx.post(url + "/v1/chat/completions", json=body, headers=AUTH)
                assert r.status_code == 200
                assert r.headers["x-route-instance"] == "b"
            assert len(shedding.seen) == 4  # tried first each time: no backoff configured
            assert metric(url, 'router_circuit_state{instance="a"}') == 0
            assert metric(url, 'router_fallbacks_total{cause="rate_limited",tier="edge"}') == 4
            shedding.status = 200
            r = httpx.post(url + "/v1/chat/completions", json=body, headers=AUTH)
            assert r.headers["x-route-instance"] == "a"
        shedding.status = 429
        with routed(states, shed_backoff_s=60.0) as url:
            for _ in range(3):
                r = httpx.post(url + "/v1/chat/completions", json=body, headers=AUTH)
                assert r.headers["x-route-instance"] == "b"
            assert len(shedding.seen) == 6  # 5 before; one refusal here, then it ranks behind b


def test_context_length_exceeded_moves_to_a_larger_window_only() -> None:
    small = Behavior(words=2, max_prompt_chars=100)
    same = Behavior(words=2, max_prompt_chars=100)
    large = Behavior(words=3, max_prompt_chars=100_000)
    long_chat = chat(False, messages=[{"role": "user", "content": "hi " * 60}])
    with serve_fake(small) as a, serve_fake(same) as b, serve_fake(large) as c:
        # The windows the instances report are wrong (the router's estimate fits them all),
        # so the edge's own 400 is what moves the request on.
        states = [
            state(a, "a", window=4096),
            state(b, "b", window=4096),
            state(c, "c", "center", "center", window=8192),
        ]
        with routed(states, center_bias_ms=1000) as url:
            r = httpx.post(url + "/v1/chat/completions", json=long_chat, headers=AUTH)
            assert r.status_code == 200
            assert r.headers["x-route-instance"] == "c"
            assert r.headers["x-route-reason"] == "fallback"
            assert len(small.seen) + len(same.seen) == 1  # the other edge's window is no larger
            assert metric(url, 'router_fallbacks_total{cause="context_length",tier="edge"}') == 1
        large.max_prompt_chars = 100
        with routed(states, center_bias_ms=1000) as url:
            r = httpx.post(url + "/v1/chat/completions", json=long_chat, headers=AUTH)
            assert r.status_code == 400
            assert r.json()["error"]["code"] == "context_length_exceeded"


def test_stall_past_the_ttft_deadline_moves_on() -> None:
    stall = Behavior(first_token_delay_s=30)
    with serve_fake(stall) as a, serve_fake(Behavior(words=2)) as b:
        with routed([state(a, "slow"), state(b, "ok", region="west")], ttft_deadline_s=0.4) as url:
            start = time.monotonic()
            r = httpx.post(url + "/v1/chat/completions", json=chat(False), headers=AUTH, timeout=10)
            assert r.status_code == 200
            assert r.json()["choices"][0]["message"]["content"] == "w0 w1"
            assert r.headers["x-route-instance"] == "ok"
            assert time.monotonic() - start < 3
        # Silence is still cut, at the request timeout, when nobody is left to try.
        with routed([state(a, "slow")], ttft_deadline_s=0.3, request_timeout_s=0.5) as url:
            r = httpx.post(url + "/v1/chat/completions", json=chat(False), headers=AUTH, timeout=10)
            assert r.status_code == 504
            assert r.json()["error"]["type"] == "timeout"


def test_the_last_candidate_is_not_cut_at_the_first_token_deadline() -> None:
    """With nobody left to fail over to, a slow first token is an answer, not a 504."""
    late = Behavior(words=2, first_token_delay_s=1.0)
    with serve_fake(late) as a, routed([state(a, "late")], ttft_deadline_s=0.3) as url:
        r = httpx.post(url + "/v1/chat/completions", json=chat(False), headers=AUTH, timeout=10)
        assert r.status_code == 200, r.text
        assert r.json()["choices"][0]["message"]["content"] == "w0 w1"


def test_a_long_prefill_on_the_last_candidate_outlasts_the_idle_timeout() -> None:
    """The idle timeout times silence once tokens flow, not the wait for the first
    one: a long cold prompt on the last candidate (its role chunk sent at once, its
    first token after the prefill) is answered, not cut into a 504."""
    prefill = Behavior(words=2, first_token_delay_s=1.2)
    with (
        serve_fake(prefill) as a,
        routed([state(a, "long")], ttft_deadline_s=0.3, idle_timeout_s=0.4) as url,
    ):
        r = httpx.post(url + "/v1/chat/completions", json=chat(False), headers=AUTH, timeout=10)
        assert r.status_code == 200, r.text
        assert r.json()["choices"][0]["message"]["content"] == "w0 w1"


def priced(plain: InstanceState, prefill_tokens_per_s: float) -> InstanceState:
    load = dataclasses.replace(plain.load, prefill_tokens_per_s=prefill_tokens_per_s)
    return dataclasses.replace(plain, load=load)


def test_the_first_token_deadline_grows_with_the_predicted_prefill() -> None:
    """A long prompt the planner prices at seconds of prefill is not cut at the fixed deadline."""
    late = Behavior(words=2, first_token_delay_s=1.0)
    long_chat = chat(False)
    long_chat["messages"] = [{"role": "user", "content": "Summarize this. " + "word " * 300}]
    with serve_fake(late) as a, serve_fake(Behavior(words=2)) as b:
        for prefill_rate, answered_by in ((50.0, "a"), (1_000_000.0, "b")):
            states = [
                priced(state(a, "a"), prefill_rate),
                priced(state(b, "b", region="west"), prefill_rate),
            ]
            with routed(states, ttft_deadline_s=0.3) as url:
                r = httpx.post(
                    url + "/v1/chat/completions", json=long_chat, headers=AUTH, timeout=20
                )
                assert r.status_code == 200, (prefill_rate, r.text)
                assert r.headers["x-route-instance"] == answered_by, prefill_rate


def test_mid_stream_death_continues_on_another_instance() -> None:
    dying = Behavior(words=8, die_after=3, token_delay_s=0.01)
    other = Behavior(words=8)
    with ExitStack() as stack:
        a, b = stack.enter_context(serve_fake(dying)), stack.enter_context(serve_fake(other))
        url = stack.enter_context(routed([state(a, "dies"), state(b, "rescue", region="west")]))
        headers, events = read_stream(url, chat(max_tokens=100))
        assert headers["x-route-instance"] == "dies"
        assert text_of(events) == "w0 w1 w2 w3 w4 w5 w6 w7"
        assert events[-1] == "[DONE]"
        ids = {e["id"] for e in events if isinstance(e, dict)}
        assert len(ids) == 1  # one stream as far as the client can tell
        roles = [e for e in events[:-1] if e["choices"][0]["delta"].get("role")]
        assert len(roles) == 1
        assert metric(url, 'router_continuations_total{outcome="ok"}') == 1
    sent = other.seen[0]["body"]
    assert sent["messages"][-1] == {"role": "assistant", "content": "w0 w1 w2"}
    assert sent["continue_final_message"] is True
    assert sent["add_generation_prompt"] is False
    assert sent["max_tokens"] == 97


def test_a_continued_final_message_stays_one_assistant_turn_after_a_break() -> None:
    dying = Behavior(words=8, die_after=3, token_delay_s=0.01)
    other = Behavior(words=8)
    messages = [{"role": "user", "content": "count"}, {"role": "assistant", "content": "w0"}]
    body = chat(messages=messages, continue_final_message=True, add_generation_prompt=False)
    with ExitStack() as stack:
        a, b = stack.enter_context(serve_fake(dying)), stack.enter_context(serve_fake(other))
        url = stack.enter_context(routed([state(a, "dies"), state(b, "rescue", region="west")]))
        _, events = read_stream(url, body)
        assert text_of(events) == " w1 w2 w3 w4 w5 w6 w7"
    sent = other.seen[0]["body"]["messages"]
    assert sent == [messages[0], {"role": "assistant", "content": "w0 w1 w2 w3"}]


def test_the_budget_shrinks_by_the_tokens_the_upstream_counted_not_its_chunks() -> None:
    dying = Behavior(words=8, die_after=3, token_delay_s=0.01, usage_tokens_per_word=2)
    other = Behavior(words=8)
    with ExitStack() as stack:
        a, b = stack.enter_context(serve_fake(dying)), stack.enter_context(serve_fake(other))
        url = stack.enter_context(routed([state(a, "dies"), state(b, "rescue", region="west")]))
        _, events = read_stream(url, chat(max_tokens=100))
        assert text_of(events) == "w0 w1 w2 w3 w4 w5 w6 w7"
    assert other.seen[0]["body"]["max_tokens"] == 94  # 3 chunks, 6 tokens


def test_mid_stream_death_without_a_rescuer_ends_with_an_error_event() -> None:
    with serve_fake(Behavior(words=8, die_after=2)) as a, routed([state(a, "dies")]) as url:
        _, events = read_stream(url, chat())
        assert text_of(events) == "w0 w1"
        assert events[-2]["error"]["type"] in ("service_unavailable", "upstream_error")
        assert events[-1] == "[DONE]"
        r = httpx.post(url + "/v1/chat/completions", json=chat(False), headers=AUTH)
        assert r.status_code in (502, 503)
        assert "error" in r.json()


def test_sigkill_mid_stream_completes_on_another_instance() -> None:
    port = free_port()
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    args = ["-m", "tests.geo_router.fake_upstream", "--port", str(port), "--words", "40"]
    with ExitStack() as stack:
        proc = subprocess.Popen([sys.executable, *args, "--token-delay", "0.05"], cwd=REPO, env=env)
        stack.callback(proc.wait)
        stack.callback(lambda: proc.poll() is None and proc.kill())
        wait_ready(f"http://127.0.0.1:{port}", timeout=30)
        rescue = stack.enter_context(serve_fake(Behavior(words=40)))
        victim = state(f"http://127.0.0.1:{port}", "victim")
        url = stack.enter_context(routed([victim, state(rescue, "rescue", region="west")]))
        body = chat(max_tokens=200)
        texts: list[str] = []
        with (
            httpx.Client(timeout=20) as c,
            c.stream("POST", url + "/v1/chat/completions", json=body, headers=AUTH) as r,
        ):
            assert r.headers["x-route-instance"] == "victim"
            lines = r.iter_lines()
            for line in lines:
                if not line.startswith("data: ") or line == "data: [DONE]":
                    continue
                texts.append(json.loads(line[6:])["choices"][0]["delta"].get("content") or "")
                if len(texts) == 5:
                    proc.send_signal(signal.SIGKILL)
                    break
            rest = [line for line in lines if line.startswith("data: ")]
        assert rest[-1] == "data: [DONE]"
        texts += [json.loads(x[6:])["choices"][0]["delta"].get("content") or "" for x in rest[:-1]]
        assert "".join(texts) == " ".join(f"w{i}" for i in range(40))


def test_hedge_races_a_second_candidate_and_cancels_the_loser() -> None:
    slow, fast = Behavior(first_token_delay_s=3, words=2), Behavior(words=2)
    with serve_fake(slow) as a, serve_fake(fast) as b:
        states = [state(a, "slow"), state(b, "fast", region="west")]
        hedge = {"enabled": True, "min_delay_ms": 100, "default_delay_ms": 100}
        with routed(states, hedge=hedge, ttft_deadline_s=5) as url:
            start = time.monotonic()
            headers, events = read_stream(url, chat())
            assert time.monotonic() - start < 2
            assert (headers["x-route-instance"], headers["x-route-reason"]) == ("fast", "hedge")
            assert text_of(events) == "w0 w1"
            assert metric(url, 'router_hedges_total{outcome="won"}') == 1
    assert len(slow.seen) == 1


def test_a_hedged_first_attempt_keeps_waiting_once_its_hedge_is_refused() -> None:
    """The deadline moves on to untried candidates; with the last one refusing
    (busy, 429), the slow first attempt is the only hope and is not cut."""
    slow = Behavior(first_token_delay_s=1.0, words=2)
    busy = Behavior(status=429, retry_after="2")
    with serve_fake(slow) as a, serve_fake(busy) as b:
        states = [state(a, "slow"), state(b, "busy", region="west")]
        hedge = {"enabled": True, "min_delay_ms": 50, "default_delay_ms": 50}
        with routed(states, hedge=hedge, ttft_deadline_s=0.3) as url:
            headers, events = read_stream(url, chat())
            assert headers["x-route-instance"] == "slow"
            assert text_of(events) == "w0 w1"
            assert metric(url, 'router_hedges_total{outcome="started"}') == 1
    assert len(busy.seen) == 1


@pytest.mark.parametrize("hedged", [True, False], ids=["hedge", "deadline"])
def test_a_hung_edge_costs_a_short_request_its_own_predicted_time(hedged: bool) -> None:
    """After long slow prompts raised the edge's P95 past a second, the edge hangs:
    a short request moves on after about its own predicted time there (the hedge,
    or without one the first-token deadline), not the P95 or the fixed 10 s."""
    edge = Behavior(words=2, prefill_s_per_char=0.0008)  # 1500 chars: 1.2 s
    with serve_fake(edge) as a, serve_fake(Behavior(words=2)) as c:
        states = [state(a, "edge"), state(c, "center", tier="center", region="center")]
        hedge = {"enabled": hedged, "min_delay_ms": 50, "default_delay_ms": 5000}
        prediction = {"min_samples": 4, "deadline_min_s": 0.3}
        with routed(
            states, hedge=hedge, prediction=prediction, ttft_deadline_s=10, center_bias_ms=5000
        ) as url:
            for n in range(4):
                long_chat = chat(False)
                # Each a new document: nothing of it is cached at the edge.
                long_chat["messages"][0]["content"] = f"Doc {n}: " + "word " * (300 + 20 * n)
                r = httpx.post(url + "/v1/chat/completions", json=long_chat, headers=AUTH)
                assert r.headers["x-route-instance"] == "edge", r.text
                assert float(r.headers["x-route-predicted-ttft-ms"]) > 0
            explained = httpx.post(url + "/v1/route/explain", json=chat(False), headers=AUTH)
            first = explained.json()["candidates"][0]
            assert (first["id"], first["prediction"]) == ("edge", "learned"), first
            edge.prefill_s_per_char, edge.first_token_delay_s = 0.0, 30.0  # it hangs
            start = time.monotonic()
            r = httpx.post(url + "/v1/chat/completions", json=chat(False), headers=AUTH)
            elapsed = time.monotonic() - start
            assert r.status_code == 200, r.text
            assert r.headers["x-route-instance"] == "center"
            assert r.headers["x-route-reason"] == ("hedge" if hedged else "fallback")
            assert elapsed < 1.0, elapsed
            ratios = 'router_ttft_prediction_ratio_count{source="formula",tier="edge"}'
            assert metric(url, ratios) == 4  # the history's, against the formula's estimate


def test_a_hedged_attempt_past_its_own_deadline_counts_as_failed() -> None:
    """The edge hangs; hedges answer for it, but only after its own first-token
    deadline: each time it missed that deadline, so its circuit opens."""
    hung, slow = Behavior(first_token_delay_s=30), Behavior(words=2, first_token_delay_s=0.5)
    with serve_fake(hung) as a, serve_fake(slow) as c:
        states = [state(a, "edge"), state(c, "center", tier="center", region="center")]
        hedge = {"enabled": True, "min_delay_ms": 50, "default_delay_ms": 100}
        breaker = {"failures": 2, "open_s": 60}
        with routed(
            states, hedge=hedge, breaker=breaker, ttft_deadline_s=0.3, center_bias_ms=5000
        ) as url:
            for _ in range(2):
                r = httpx.post(url + "/v1/chat/completions", json=chat(False), headers=AUTH)
                assert (r.headers["x-route-instance"], r.headers["x-route-reason"]) == (
                    "center",
                    "hedge",
                )
            assert metric(url, 'router_circuit_state{instance="edge"}') == 2  # open
            assert metric(url, 'router_fallbacks_total{cause="timeout",tier="edge"}') == 2


def test_circuit_opens_after_failures_then_probes_half_open() -> None:
    bad = Behavior(status=500)
    with serve_fake(bad) as a, serve_fake(Behavior(words=1)) as ctr:
        states = [state(a, "bad"), state(ctr, "c", "center", "center")]
        breaker = {"failures": 2, "open_s": 0.5}
        with routed(states, breaker=breaker, center_bias_ms=0) as url:
            for _ in range(4):
                r = httpx.post(url + "/v1/chat/completions", json=chat(False), headers=AUTH)
                assert r.status_code == 200
            assert len(bad.seen) == 2  # open after two failures: no more traffic
            assert metric(url, 'router_circuit_state{instance="bad"}') == 2
            time.sleep(0.6)
            bad.status = 200
            r = httpx.post(url + "/v1/chat/completions", json=chat(False), headers=AUTH)
            assert r.headers["x-route-instance"] == "bad"  # the half-open probe
            assert metric(url, 'router_circuit_state{instance="bad"}') == 0


def test_client_disconnect_closes_the_upstream_stream() -> None:
    slow = Behavior(words=200, token_delay_s=0.05)
    with serve_fake(slow) as a, routed([state(a, "slow")]) as url:
        with (
            httpx.Client(timeout=20) as c,
            c.stream("POST", url + "/v1/chat/completions", json=chat(), headers=AUTH) as r,
        ):
            for n, _ in enumerate(r.iter_lines()):
                if n >= 6:
                    break
        deadline = time.monotonic() + 5
        while slow.aborted == 0 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert slow.aborted == 1  # the router hung up on the upstream too
        assert httpx.get(url + "/ready").status_code == 200


def test_a_stream_that_goes_quiet_is_continued_after_the_idle_timeout() -> None:
    quiet, rescue = Behavior(words=6, stall_after=2), Behavior(words=6)
    with ExitStack() as stack:
        a, b = stack.enter_context(serve_fake(quiet)), stack.enter_context(serve_fake(rescue))
        url = stack.enter_context(
            routed([state(a, "quiet"), state(b, "rescue", region="west")], idle_timeout_s=0.5)
        )
        start = time.monotonic()
        _, events = read_stream(url, chat())
        assert text_of(events) == "w0 w1 w2 w3 w4 w5"
        assert events[-1] == "[DONE]"
        assert time.monotonic() - start < 5
    assert rescue.seen[0]["body"]["messages"][-1]["content"] == "w0 w1"


def test_streams_that_end_with_done_keep_the_upstream_connection_alive() -> None:
    up = Behavior(words=3)
    with serve_fake(up) as a, routed([state(a, "e")]) as url:
        for stream in (True, True, False, True, False):
            if stream:
                _, events = read_stream(url, chat())
                assert text_of(events) == "w0 w1 w2"
            else:
                r = httpx.post(url + "/v1/chat/completions", json=chat(False), headers=AUTH)
                assert r.json()["choices"][0]["message"]["content"] == "w0 w1 w2"
    assert len(up.seen) == 5
    assert len({s["client_port"] for s in up.seen}) == 1  # one connection, read out and reused


# -- bugs the split dispatcher hid (issue 25) -------------------------------------


def test_a_trimmed_continuation_keeps_the_partial_answer() -> None:
    """On a tier that trims, the continuation is trimmed from the *continued*
    messages: the partial answer stays the open final assistant turn."""
    dying = Behavior(words=8, die_after=3, token_delay_s=0.01)
    other = Behavior(words=8)
    history = [
        {"role": "user" if i % 2 == 0 else "assistant", "content": f"turn {i} " + "x " * 60}
        for i in range(8)
    ]
    body = chat(messages=[{"role": "system", "content": "be brief"}, *history, *chat()["messages"]])
    trimming = {"edge": {"enabled": True, "max_prompt_tokens": 120}}
    with ExitStack() as stack:
        a, b = stack.enter_context(serve_fake(dying)), stack.enter_context(serve_fake(other))
        states = [state(a, "dies"), state(b, "rescue", region="west")]
        url = stack.enter_context(routed(states, trimming=trimming))
        headers, events = read_stream(url, body)
        assert "x-route-trimmed" in headers
        assert text_of(events) == "w0 w1 w2 w3 w4 w5 w6 w7"
    first, sent = dying.seen[0]["body"], other.seen[0]["body"]
    assert first["messages"][-1] == {"role": "user", "content": "hi"}
    assert len(first["messages"]) < len(body["messages"])  # trimmed
    assert sent["messages"][0] == {"role": "system", "content": "be brief"}
    assert sent["messages"][-2:] == [
        {"role": "user", "content": "hi"},
        {"role": "assistant", "content": "w0 w1 w2"},
    ]
    assert sent["continue_final_message"] is True


def test_a_connect_timeout_is_unavailable_as_in_the_central_gateway() -> None:
    """Nothing was sent: 503 ``upstream_unavailable`` (retryable), not a 504."""
    with unanswered_url() as hung, serve_fake(Behavior(words=2)) as center:
        settings = {"connect_timeout_s": 0.2}
        states = [state(hung, "hung"), state(center, "c", "center", "center")]
        with routed_with(states, settings) as app_url:
            headers, events = read_stream(app_url, chat())
            assert headers["x-route-instance"] == "c"
            assert text_of(events) == "w0 w1"
            assert metric(app_url, 'router_fallbacks_total{cause="unavailable",tier="edge"}') == 1
        with routed_with([state(hung, "hung")], settings) as stack_url:
            r = httpx.post(stack_url + "/v1/chat/completions", json=chat(False), headers=AUTH)
            assert r.status_code == 503, r.text
            assert r.json()["error"]["code"] == "upstream_unavailable"


@contextmanager
def routed_with(states: list[InstanceState], top: dict[str, Any]) -> Iterator[str]:
    settings = router_settings([], routing={"ttft_deadline_s": 1.0, "slow_start_s": 0}, **top)
    app = create_app(settings, candidates=lambda: states)
    with UvicornThread(app, http=HeadWithBodyProtocol) as server:
        yield server.url


def test_an_upstreams_retry_after_is_its_back_off() -> None:
    """A 429 with ``Retry-After: 30`` ranks the instance last for 30 s, whatever
    ``shed_backoff_s`` (the back-off when an upstream gives none) says."""
    busy = Behavior(status=429, retry_after="30")
    with serve_fake(busy) as a, serve_fake(Behavior(words=2)) as b:
        states = [state(a, "busy"), state(b, "b", region="west")]
        with routed(states, shed_backoff_s=0.0) as url:
            for _ in range(3):
                r = httpx.post(url + "/v1/chat/completions", json=chat(False), headers=AUTH)
                assert r.headers["x-route-instance"] == "b"
    assert len(busy.seen) == 1


def test_explain_does_not_half_open_a_circuit() -> None:
    """Explain is a read: an open circuit past its open time stays open until a
    request actually probes it."""
    bad = Behavior(status=500)
    with serve_fake(bad) as a, serve_fake(Behavior(words=1)) as ctr:
        states = [state(a, "bad"), state(ctr, "c", "center", "center")]
        breaker = {"failures": 1, "open_s": 0.3}
        with routed(states, breaker=breaker, center_bias_ms=0) as url:
            r = httpx.post(url + "/v1/chat/completions", json=chat(False), headers=AUTH)
            assert r.headers["x-route-instance"] == "c"
            assert metric(url, 'router_circuit_state{instance="bad"}') == 2
            time.sleep(0.4)
            for _ in range(2):
                r = httpx.post(url + "/v1/route/explain", json=chat(False), headers=AUTH)
                assert r.status_code == 200
                assert metric(url, 'router_circuit_state{instance="bad"}') == 2
            bad.status = 200
            r = httpx.post(url + "/v1/chat/completions", json=chat(False), headers=AUTH)
            assert r.headers["x-route-instance"] == "bad"  # the probe
            assert metric(url, 'router_circuit_state{instance="bad"}') == 0
