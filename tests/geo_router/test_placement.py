"""Placement by what an instance must prefill, what it can hold and whether it can start in time."""

from __future__ import annotations

import random
import time
from typing import Any

from geo_router.classifier import TaskClassifier
from geo_router.planner import Planner
from geo_router.prefix_index import PrefixIndex
from geo_router.region import ResolvedRegion
from geo_router.scoring import Scorer
from geo_router.settings import RegionSettings, RoutingSettings
from geo_router.tracker import Tracker
from geo_router.trimming import trim_messages
from servekit.engine.protocol import LoadReport
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


def planner(states: list[InstanceState], **routing: Any) -> tuple[Planner, PrefixIndex, Tracker]:
    settings = RoutingSettings.model_validate({"slow_start_s": 0, **routing})
    tracker = Tracker(settings.breaker)
    scorer = Scorer(settings, REGIONS.rtt_table(), tracker, random.Random(3))
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
    chosen = p.plan(body, EAST, "u").candidates[0]
    assert chosen.prefix is not None
    index.record(chosen.id, chosen.prefix)
    return chosen.id


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


def test_trimming_is_opt_in_per_tier_and_keeps_the_system_prompt_and_latest_turns() -> None:
    # Same engines (the local topology's CPU stand-ins): only the window differs.
    states = [
        inst("edge-a", max_context_tokens=512, prefill_tokens_per_s=150.0),
        inst("center", "center", "center", max_context_tokens=8192, prefill_tokens_per_s=150.0),
    ]
    history = [
        {"role": "user" if i % 2 == 0 else "assistant", "content": f"turn {i} " + "word " * 80}
        for i in range(12)
    ]
    messages = [
        {"role": "system", "content": "Be brief."},
        *history,
        {"role": "user", "content": "ok"},
    ]
    body = {"model": "auto", "max_tokens": 64, "messages": messages}
    p, _, _ = planner(states, trimming={"edge": {"enabled": True}})
    chosen = p.plan(body, EAST, "u").candidates[0]
    assert chosen.id == "edge-a"
    assert chosen.trim is not None
    kept = chosen.trim.messages
    assert kept[0]["content"] == "Be brief."
    assert kept[-1]["content"] == "ok"
    assert kept[1]["role"] == "user"
    assert messages[-len(kept) + 1 :] == kept[1:]
    assert chosen.trim.tokens <= 512 - 64
    assert chosen.to_dict()["trimmed"] == {"dropped_messages": chosen.trim.dropped}
    # The center's policy is off: it would get the whole conversation.
    center = next(c for c in p.plan(body, EAST, "u").candidates if c.tier == "center")
    assert center.trim is None


def test_trim_returns_nothing_when_it_fits_or_cannot() -> None:
    msgs = [{"role": "system", "content": "s"}, {"role": "user", "content": "hello"}]
    assert trim_messages(msgs, 100) is None
    huge = [{"role": "system", "content": "s"}, {"role": "user", "content": "x " * 2000}]
    assert trim_messages(huge, 100) is None


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


def test_a_prefix_cached_only_in_another_city_warms_the_same_city_edge_once() -> None:
    states = [
        inst("edge-a", prefill_tokens_per_s=150.0),
        inst("edge-b", region="west", prefill_tokens_per_s=170.0),  # measured a bit faster
        inst("center", tier="center", region="center", prefill_tokens_per_s=150.0),
    ]
    p, index, _ = planner(states, center_bias_ms=1000.0)
    first = p.plan(support("What are your store hours?"), EAST, "u").candidates[0]
    assert (first.id, first.warming) == ("edge-b", False)  # cold everywhere: the faster one
    assert first.prefix is not None
    index.record("edge-b", first.prefix)
    second = p.plan(support("Do you ship to Canada?"), EAST, "u").to_dict()
    assert second["instance"] == "edge-a"
    assert second["candidates"][0]["warming"] is True
    assert second["reason"] == "simple"
    chosen = p.plan(support("Do you ship to Canada?"), EAST, "u").candidates[0]
    assert chosen.prefix is not None
    index.record("edge-a", chosen.prefix)
    third = p.plan(support("Is shipping free?"), EAST, "u").candidates[0]
    assert (third.id, third.warming) == ("edge-a", False)  # it holds it now
    # A busy same-city edge is not warmed: the neighbour that holds the prefix serves.
    states[0] = inst("edge-a", prefill_tokens_per_s=150.0, running=4, waiting=6)
    p2, index2, _ = planner(states, center_bias_ms=1000.0)
    index2.record("edge-b", first.prefix)
    assert p2.plan(support("Hours?"), EAST, "u").candidates[0].id == "edge-b"
