"""Placement by what an instance must prefill, what it can hold and whether it can start in time."""

from __future__ import annotations

import os
import random
import subprocess
import sys
import time
from typing import Any

from geo_router.classifier import TaskClassifier
from geo_router.conversation import Turn
from geo_router.planner import Planner
from geo_router.prefix_index import PrefixIndex
from geo_router.region import ResolvedRegion
from geo_router.region_settings import RegionSettings
from geo_router.routing_settings import RoutingSettings
from geo_router.scoring import Scored, Scorer
from geo_router.tracker import Tracker
from servekit.engine.protocol import LoadReport
from servekit.prefix_blocks import sampled
from servekit.registry.protocol import InstanceInfo, InstanceState

REGIONS = RegionSettings(
    default="east", rtt_ms={"east": {"west": 40.0, "center": 150.0}, "west": {"center": 120.0}}
)
EAST = ResolvedRegion("east", "default", None)
# About 450 tokens of a store's customer-service instructions.
SYSTEM = " ".join(
    f"Rule {i}: be polite, answer briefly, and point customers to the help page for orders."
    for i in range(24)
)


def inst(iid: str, tier: str = "edge", region: str = "east", **load: Any) -> InstanceState:
    info = InstanceInfo(iid, tier, region, "127.0.0.1", 1, "m", "v1", capacity=4)  # type: ignore[arg-type]
    report = LoadReport(ready=True, **{"capacity": 4, **load})
    return InstanceState(info, report, True, time.time())


def planner(
    states: list[InstanceState], seed: int = 3, **routing: Any
) -> tuple[Planner, PrefixIndex, Tracker]:
    settings = RoutingSettings.model_validate({"slow_start_s": 0, **routing})
    tracker = Tracker(settings.breaker)
    scorer = Scorer(settings, REGIONS.rtt_table(), tracker, random.Random(seed))
    index = PrefixIndex()
    p = Planner(settings, TaskClassifier.load(), scorer, tracker, lambda: states, {}.get, index)
    return p, index, tracker


def support(question: str) -> dict[str, Any]:
    return {
        "model": "auto",
        "max_tokens": 64,
        "messages": [
            {"role": "system", "content": SYSTEM},
            {"role": "user", "content": question},
        ],
    }


def served(p: Planner, index: PrefixIndex, body: dict[str, Any]) -> str:
    """Plan ``body`` and record it where it went, as the dispatcher does once primed."""
    return serve(p, index, body).id


def serve(p: Planner, index: PrefixIndex, body: dict[str, Any]) -> Scored:
    chosen = p.plan(body, EAST, "u").candidates[0]
    assert chosen.prefix is not None
    index.served(chosen.id, chosen.prefix, warming=chosen.warming, rent_ms=chosen.rent_ms)
    return chosen


def test_a_cached_system_prompt_is_charged_only_where_it_is_not_cached() -> None:
    # The center prefills 30x faster: a cold 450-token prompt is cheaper there.
    states = [
        inst("edge-a", prefill_tokens_per_s=150.0),
        inst("edge-b", region="west", prefill_tokens_per_s=150.0),
        inst("center", tier="center", region="center", prefill_tokens_per_s=4500.0),
    ]
    p, index, _ = planner(states)
    first = p.plan(support("What are your store hours?"), EAST, "u")
    assert first.classification is not None
    assert first.classification.difficulty == "simple"
    assert first.candidates[0].id == "center"
    # edge-a served that system prompt once (say, a pinned request): now it holds it.
    edge_a = next(c for c in first.candidates if c.id == "edge-a")
    assert edge_a.prefix is not None
    index.record("edge-a", edge_a.prefix)
    again = p.plan(support("Do you ship to Canada?"), EAST, "u").to_dict()
    by_id = {c["id"]: c for c in again["candidates"]}
    assert again["instance"] == "edge-a"
    assert again["reason"] == "simple"
    assert by_id["edge-a"]["cached_tokens"] > 0.9 * by_id["edge-a"]["prompt_tokens"] - 20
    assert by_id["edge-b"]["cached_tokens"] == 0
    assert by_id["edge-a"]["prefill_ms"] < by_id["edge-b"]["prefill_ms"] / 5


def test_same_prefix_traffic_sticks_to_one_edge_until_waiting_there_costs_more() -> None:
    states = [
        inst("edge-a", prefill_tokens_per_s=150.0),
        inst("edge-a2", prefill_tokens_per_s=150.0),
        inst("center", tier="center", region="center", prefill_tokens_per_s=150.0),
    ]
    p, index, tracker = planner(states)
    homes = [served(p, index, support(f"Is the shop in street {i} open today?")) for i in range(12)]
    assert len(set(homes[1:])) == 1  # after the first, all on the edge that holds the prompt
    home = homes[-1]
    for _ in range(4):  # full, but queueing behind 4 (~1 s) still beats a cold 3 s prefill
        tracker.acquire(home)
    assert p.plan(support("Where is my parcel?"), EAST, "u").candidates[0].id == home
    for _ in range(4):  # four more waiting: now the cold edge starts sooner
        tracker.acquire(home)
    other = p.plan(support("Where is my parcel?"), EAST, "u").candidates[0]
    assert other.id != home
    assert other.tier == "edge"


def test_a_conversation_longer_than_the_edge_window_goes_to_the_center() -> None:
    # Same engines (the local topology's CPU stand-ins): only the window differs.
    states = [
        inst("edge-a", max_context_tokens=512, prefill_tokens_per_s=150.0),
        inst("center", "center", "center", max_context_tokens=8192, prefill_tokens_per_s=150.0),
    ]
    p, _, _ = planner(states)
    history = [
        {"role": "user" if i % 2 == 0 else "assistant", "content": f"turn {i} " + "word " * 80}
        for i in range(12)
    ]
    body = {
        "model": "auto",
        "max_tokens": 64,
        "messages": [*history, {"role": "user", "content": "ok"}],
    }
    decision = p.plan(body, EAST, "u")
    assert [c.id for c in decision.candidates] == ["center"]
    assert decision.prompt_tokens > 512
    short = p.plan({**body, "messages": body["messages"][-3:]}, EAST, "u")
    assert short.candidates[0].id == "edge-a"
    # Nobody holds it: the largest window is tried (its own 400 reaches the client).
    tiny = [
        inst("edge-a", max_context_tokens=256),
        inst("c", "center", "center", max_context_tokens=300),
    ]
    p2, _, _ = planner(tiny)
    none_fits = p2.plan(body, EAST, "u")
    assert [c.id for c in none_fits.candidates] == ["c"]
    assert none_fits.to_dict()["fits_a_window"] is False


def test_an_edge_that_would_refuse_on_its_budget_ranks_behind_those_that_can_start() -> None:
    states = [
        inst("edge-a", running=4, capacity=4, waiting=2, ttft_budget_ms=300.0),
        inst("edge-b", region="west"),
        inst("center", tier="center", region="center"),
    ]
    p, _, _ = planner(states, center_bias_ms=5000.0)
    ranked = p.plan(support("hi"), EAST, "u").candidates
    assert ranked[-1].id == "edge-a"
    assert ranked[-1].over_budget
    # A 429 there is not a failure: it only ranks last for a moment.
    idle = [inst("edge-a"), inst("edge-b", region="west")]
    p2, _, tracker2 = planner(idle, shed_backoff_s=30.0)
    assert p2.plan(support("hi"), EAST, "u").candidates[0].id == "edge-a"
    for _ in range(5):
        tracker2.refused("edge-a", 30.0)
    assert tracker2.available("edge-a")
    assert p2.plan(support("hi"), EAST, "u").candidates[0].id == "edge-b"


def test_over_budget_counts_the_requests_own_prefill_as_the_instance_does() -> None:
    """A cold long prompt: over budget once a little wait is added to its prefill (as
    the instance's admission counts it); on an idle instance it is not (its share is capped)."""
    long_prompt = "Summarize this: " + "the ferry left the harbour before dawn. " * 60
    budget = {"ttft_budget_ms": 1000.0, "prefill_tokens_per_s": 1000.0}
    for busy, over in ((0, False), (3, True)):
        states = [inst("edge-a", running=busy, capacity=4, busy_ms_per_seq=100.0, **budget)]
        p, _, _ = planner(states)
        (cand,) = p.plan(support(long_prompt), EAST, "u").candidates
        assert cand.prefill_ms > 500.0  # its own prefill alone is most of the budget
        assert cand.over_budget is over, (busy, cand.busy_ms, cand.prefill_ms)


def test_a_prompt_too_long_for_the_budget_is_over_it_on_any_busy_instance() -> None:
    """Its prefill alone (~600 ms) spends the budget (500 ms): only an idle instance
    takes it (its share capped), however little wait a busy one predicts."""
    long_prompt = "Summarize this: " + "the ferry left the harbour before dawn. " * 60
    budget = {"ttft_budget_ms": 500.0, "prefill_tokens_per_s": 1000.0}
    for busy, over in ((0, False), (1, True)):
        states = [inst("edge-a", running=busy, capacity=4, busy_ms_per_seq=20.0, **budget)]
        p, _, _ = planner(states)
        (cand,) = p.plan(support(long_prompt), EAST, "u").candidates
        assert cand.prefill_ms > 500.0
        assert cand.busy_ms < 100.0
        assert cand.over_budget is over, (busy, cand.busy_ms, cand.prefill_ms)


def test_a_shared_prompt_cached_in_another_city_moves_home_once_its_rent_pays_the_move() -> None:
    """Ski rental: each conversation served away pays what a warm same-city edge would
    have saved it; once that adds up to the cold start there, the prompt moves home."""
    states = [
        inst("edge-a", prefill_tokens_per_s=150.0),
        inst("edge-b", region="west", prefill_tokens_per_s=170.0),  # measured a bit faster
        inst("center", tier="center", region="center", prefill_tokens_per_s=150.0),
    ]
    p, index, _ = planner(states, center_bias_ms=1000.0)
    first = serve(p, index, support("What are your store hours?"))
    assert (first.id, first.warming) == ("edge-b", False)  # cold everywhere: the faster one
    chosen = [serve(p, index, support(f"Question {n} about shipping?")) for n in range(200)]
    away = [c for c in chosen if c.id == "edge-b"]
    moved = next(i for i, c in enumerate(chosen) if c.id == "edge-a")
    assert chosen[moved].warming
    assert 1 <= moved == len(away)  # it paid rent first, then moved, and never went back
    assert all(c.rent_ms > 0 and not c.warming for c in away)
    cold_extra = (
        chosen[moved].predicted_ms
        - p.plan(support("again?"), EAST, "u").to_dict()["candidates"][0]["rank_ms"]
    )
    assert sum(c.rent_ms for c in away) >= cold_extra - away[0].rent_ms  # the rent paid it
    assert all(c.id == "edge-a" and not c.warming for c in chosen[moved + 1 :])
    # A busy same-city edge is not warmed: the neighbour that holds the prefix serves.
    states[0] = inst("edge-a", prefill_tokens_per_s=150.0, running=4, waiting=6)
    p2, index2, _ = planner(states, center_bias_ms=1000.0)
    assert first.prefix is not None
    index2.served("edge-b", first.prefix, rent_ms=1e9)
    assert p2.plan(support("Hours?"), EAST, "u").candidates[0].id == "edge-b"


def test_a_one_off_conversation_stays_where_its_history_is_cached() -> None:
    """Its opening is its own: only its own turns pay rent, far short of a cold start."""
    states = [
        inst("edge-a", prefill_tokens_per_s=150.0),
        inst("edge-b", region="west", prefill_tokens_per_s=150.0),
    ]
    p, index, _ = planner(states)
    states[0] = inst("edge-a", prefill_tokens_per_s=150.0, running=4, waiting=6)  # busy then
    pasted = "Hanseatic towns traded salt, furs, grain and cloth along the Baltic. " * 25
    history = [{"role": "user", "content": "Summarize this for me: " + pasted}]
    first = serve(p, index, {"model": "auto", "max_tokens": 64, "messages": history})
    assert first.id == "edge-b"
    states[0] = inst("edge-a", prefill_tokens_per_s=150.0)  # and idle again
    for turn in range(4):
        history += [
            {"role": "assistant", "content": "It was a league of merchant towns."},
            {"role": "user", "content": f"And what about point {turn}?"},
        ]
        nxt = serve(p, index, {"model": "auto", "max_tokens": 64, "messages": history})
        assert (nxt.id, nxt.warming) == ("edge-b", False)
        assert nxt.rent_ms > 0
        assert nxt.cached_tokens > 0


def test_two_routers_send_a_new_system_prompt_to_the_same_edge_without_talking() -> None:
    # Two routers: separate indexes, trackers and random streams; three equal same-city edges.
    states = [inst(f"edge-{i}", prefill_tokens_per_s=150.0) for i in range(3)]
    homes: dict[str, set[str]] = {}
    for seed in (1, 2, 3, 4):
        p, index, _ = planner(states, seed=seed)  # each router draws its own p2c samples
        for n in range(12):
            body = support(f"Question {n}?")
            body["messages"][0]["content"] = f"Store {n % 6}. " + SYSTEM  # six tenants' prompts
            homes.setdefault(f"store-{n % 6}", set()).add(served(p, index, body))
    assert all(len(h) == 1 for h in homes.values()), homes  # every router agrees per prompt
    assert len({next(iter(h)) for h in homes.values()}) > 1  # and prompts spread over edges


def test_what_was_sent_after_a_report_was_taken_counts_though_it_was_read_later() -> None:
    """A chat's next turn half a second after its answer: the report polled just before
    the answer ended was first read when that turn was scored, and hid the answer."""
    index = PrefixIndex()
    body = support("Where is my parcel?")
    turns = [Turn(m["role"], m["content"]) for m in body["messages"]]
    prefix = index.prefix(turns, 500)

    def report(other: int) -> LoadReport:  # each poll's own report, of another prompt
        return LoadReport(ready=True, prefix_blocks=(other,), prefix_block_chars=64)

    assert index.cached_blocks("edge-a", prefix, report(1), now=9.0).blocks == 0
    index.record("edge-a", prefix, now=10.0)  # sent, and answered
    taken = report(2)  # asked for at 9.8
    found = index.cached_blocks("edge-a", prefix, taken, now=10.5, report_age_s=0.7)
    assert (found.blocks, found.source) == (len(prefix.blocks), "router")
    # Taken after the send: the report is believed (the instance dropped it).
    later = report(3)
    assert index.cached_blocks("edge-a", prefix, later, now=11.0, report_age_s=0.5).blocks == 0


def test_block_names_and_anchor_are_the_same_in_every_process() -> None:
    code = (
        "from geo_router.prefix_index import PrefixIndex;"
        "from geo_router.conversation import Turn;"
        "p = PrefixIndex().prefix([Turn('system', 'x' * 3000)], 700);"
        "print(p.anchor, p.blocks[-1])"
    )
    seen = [
        subprocess.run(
            [sys.executable, "-c", code],
            env={**os.environ, "PYTHONHASHSEED": seed},
            capture_output=True,
            text=True,
            check=True,
        ).stdout.split()
        for seed in ("1", "2")
    ]
    # str hashes are salted per process; anchors and block names must not be
    assert seen[0] == seen[1]


def test_an_instances_own_report_is_believed_and_a_restart_forgets_what_was_sent() -> None:
    index = PrefixIndex()
    body = support("Where is my parcel?")
    turns = [Turn(m["role"], m["content"]) for m in body["messages"]]
    prefix = index.prefix(turns, 500)
    # Another router sent this conversation to edge-a: its report says so, ours does not.
    names = tuple(sampled(prefix.blocks, 4))
    report = LoadReport(ready=True, prefix_blocks=names, prefix_block_chars=64)
    found = index.cached_blocks("edge-a", prefix, report, now=10.0)
    assert (found.blocks, found.source) == (len(prefix.blocks), "reported")
    # We send it there ourselves; then edge-a restarts and reports an empty cache.
    index.record("edge-a", prefix, now=11.0)
    restarted = LoadReport(ready=True, prefix_blocks=(), prefix_block_chars=64)
    assert index.cached_blocks("edge-a", prefix, restarted, now=12.0).blocks == 0
    # What we send after seeing that report counts until the next one shows it.
    index.record("edge-a", prefix, now=13.0)
    assert index.cached_blocks("edge-a", prefix, restarted, now=13.5).source == "router"
    # An instance that reports nothing, or in another block size: our own record.
    assert index.cached_blocks("edge-b", prefix, LoadReport(ready=True)).blocks == 0
    other = LoadReport(ready=True, prefix_blocks=names, prefix_block_chars=128)
    assert index.cached_blocks("edge-a", prefix, other, now=14.0).source == "router"
