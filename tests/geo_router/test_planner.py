"""Scoring, power-of-two choices, slow start, spill, canary and the circuit breaker."""

from __future__ import annotations

import random
import time
from collections import Counter
from typing import Any

import pytest

from geo_router.classifier import TaskClassifier
from geo_router.planner import Planner, canary_version
from geo_router.region import ResolvedRegion
from geo_router.region_settings import RegionSettings
from geo_router.routing_settings import BreakerSettings, RoutingSettings
from geo_router.scoring import Scorer
from geo_router.tracker import Circuit, Tracker
from servekit.engine.protocol import LoadReport
from servekit.errors import ModelNotFound, NotReady
from servekit.registry.protocol import InstanceInfo, InstanceState

REGIONS = RegionSettings(
    default="east", rtt_ms={"east": {"west": 40.0, "center": 30.0}, "west": {"center": 30.0}}
)
EAST = ResolvedRegion("east", "default", None)
SIMPLE: dict[str, Any] = {"model": "auto", "messages": [{"role": "user", "content": "hi"}]}


def inst(iid: str, tier: str = "edge", region: str = "east", **load: Any) -> InstanceState:
    version = load.pop("version", "v1")
    model = load.pop("model", "m")
    info = InstanceInfo(iid, tier, region, "127.0.0.1", 1, model, version)  # type: ignore[arg-type]
    report = LoadReport(ready=True, **{"capacity": 1, **load})
    return InstanceState(info, report, True, time.time())


def planner(
    states: list[InstanceState],
    traffic: dict[str, dict[str, float]] | None = None,
    **routing: Any,
) -> tuple[Planner, Tracker]:
    settings = RoutingSettings.model_validate({"slow_start_s": 0, **routing})
    tracker = Tracker(settings.breaker)
    scorer = Scorer(settings, REGIONS.rtt_table(), tracker, random.Random(7))
    clf = TaskClassifier.load()
    p = Planner(settings, clf, scorer, tracker, lambda: states, (traffic or {}).get)
    return p, tracker


def test_local_edge_first_then_others_and_the_center_within_the_attempts() -> None:
    states = [inst("w", region="west"), inst("e"), inst("w2", region="west"), inst("c", "center")]
    p, _ = planner(states, max_attempts=2, center_bias_ms=100)
    d = p.plan(SIMPLE, EAST, "u")
    assert [c.id for c in d.candidates][:2] == ["e", "c"]  # failover ends at the center
    assert d.reason(d.candidates[0]) == "simple"


def test_a_saturated_local_edge_spills_to_the_neighbour_or_center() -> None:
    busy = inst("e", running=1, waiting=3)  # queue wait: 4 × 3000 ms
    p, _ = planner([busy, inst("w", region="west"), inst("c", "center", "center")])
    d = p.plan(SIMPLE, EAST, "u")
    assert d.candidates[0].id == "w"
    assert d.reason(d.candidates[0]) == "spill-region"
    p, _ = planner([busy, inst("c", "center", "center")])
    d = p.plan(SIMPLE, EAST, "u")
    assert (d.candidates[0].id, d.reason(d.candidates[0])) == ("c", "spill-center")
    assert d.candidates[1].queue_ms == pytest.approx(4 * 3000.0)


def test_a_busy_batching_edge_spills_by_its_measured_slowdown_per_sequence() -> None:
    # Below capacity there is no queue, but each running sequence slows a new
    # arrival by what the engine measured one to cost: 2 x 100 ms > the 40 ms to the west.
    slow = {"capacity": 4, "busy_ms_per_seq": 100.0}
    busy = inst("e", running=2, **slow)
    states = [busy, inst("w", region="west", **slow), inst("c", "center", "center")]
    p, _ = planner(states, center_bias_ms=1000)
    d = p.plan(SIMPLE, EAST, "u")
    assert (d.candidates[0].id, d.reason(d.candidates[0])) == ("w", "spill-region")
    local = next(c for c in d.candidates if c.id == "e")
    assert (local.queue_ms, local.busy_ms) == (0.0, pytest.approx(200.0))
    assert local.to_dict()["busy_ms"] == pytest.approx(200.0)
    # The weight scales it; at most capacity sequences count (the rest queue).
    p, _ = planner(states, busy_slowdown_weight=0.5)
    half = next(c for c in p.plan(SIMPLE, EAST, "u").candidates if c.id == "e")
    assert half.busy_ms == pytest.approx(100.0)
    full = inst("e", running=4, waiting=3, **slow)
    p, _ = planner([full])
    assert p.plan(SIMPLE, EAST, "u").candidates[0].busy_ms == pytest.approx(400.0)
    # One running sequence: 2 + 100 ms > 40 ms, it spills too; an idle one wins.
    one = inst("e", running=1, **slow)
    assert planner([one, states[1]])[0].plan(SIMPLE, EAST, "u").candidates[0].id == "w"
    idle = inst("e", **slow)
    assert planner([idle, states[1]])[0].plan(SIMPLE, EAST, "u").candidates[0].id == "e"
    # Switched off, or before the engine measured it, only the queue counts.
    p, _ = planner(states, center_bias_ms=1000, busy_slowdown_weight=0)
    assert p.plan(SIMPLE, EAST, "u").candidates[0].id == "e"
    unreported = inst("e", running=2, capacity=4)
    p, _ = planner([unreported, inst("w", region="west", capacity=4)])
    assert p.plan(SIMPLE, EAST, "u").candidates[0].id == "e"


def test_a_wide_ttft_spread_alone_is_no_busy_penalty() -> None:
    # Long and short prompts spread an idle engine's TTFTs by hundreds of ms;
    # that is prefill, already estimated from the prompt, not a cost of being busy.
    spread = {"capacity": 4, "ttft_p50_ms": 100.0, "ttft_p95_ms": 500.0, "busy_ms_per_seq": 5.0}
    p, _ = planner([inst("e", running=2, **spread), inst("w", region="west", **spread)])
    first = p.plan(SIMPLE, EAST, "u").candidates[0]
    assert (first.id, first.busy_ms) == ("e", pytest.approx(10.0))


def test_the_router_s_own_inflight_count_makes_an_edge_busy_too() -> None:
    spread = {"capacity": 4, "busy_ms_per_seq": 100.0}
    p, tracker = planner([inst("e", **spread), inst("w", region="west", **spread)])
    assert p.plan(SIMPLE, EAST, "u").candidates[0].id == "e"
    tracker.acquire("e")  # dispatched, not yet in a load report
    assert p.plan(SIMPLE, EAST, "u").candidates[0].id == "w"


def test_requests_that_ended_after_the_load_report_no_longer_count_in_it() -> None:
    spread = {"capacity": 4, "busy_ms_per_seq": 100.0}
    stale = inst("e", running=2, **spread)  # reported while two of ours ran there
    p, tracker = planner([stale, inst("w", region="west", **spread)])
    before = p.plan(SIMPLE, EAST, "u").candidates
    assert (before[0].id, before[0].busy_ms) == ("w", 0.0)
    for _ in range(2):
        tracker.acquire("e")
        tracker.release("e")  # both answered since: the edge is idle
    after = p.plan(SIMPLE, EAST, "u").candidates
    assert (after[0].id, after[0].busy_ms) == ("e", 0.0)
    # Releases before the report was taken do not discount it.
    states = [inst("e", **spread)]
    p, tracker = planner(states)
    tracker.acquire("e")
    tracker.release("e")
    states[0] = inst("e", running=2, **spread)  # a newer report: two from other routers
    assert p.plan(SIMPLE, EAST, "u").candidates[0].busy_ms == pytest.approx(200.0)


def test_router_inflight_counts_before_the_next_load_report() -> None:
    p, tracker = planner([inst("e1", capacity=2), inst("e2", capacity=2)], p2c_window_ms=0)
    for _ in range(3):
        tracker.acquire("e1")
    d = p.plan(SIMPLE, EAST, "u")
    assert d.candidates[0].id == "e2"


def test_power_of_two_spreads_equal_candidates_and_slow_start_holds_new_ones_back() -> None:
    states = [inst(f"e{i}") for i in range(4)]
    p, _ = planner(states)
    firsts = Counter(p.plan(SIMPLE, EAST, "u").candidates[0].id for _ in range(400))
    assert set(firsts) == {"e0", "e1", "e2", "e3"}
    assert min(firsts.values()) > 50
    p, tracker = planner(states, slow_start_s=100)
    for i in range(3):
        tracker.stats(f"e{i}").first_seen -= 1000  # old hands; e3 just joined
    firsts = Counter(p.plan(SIMPLE, EAST, "u").candidates[0].id for _ in range(400))
    assert firsts["e3"] < 20


def test_hard_requests_prefer_the_center_and_models_can_be_pinned() -> None:
    hard = {
        "model": "auto",
        "messages": [
            {"role": "user", "content": "请详细分析分布式系统中一致性协议的设计权衡，并给出证明。"}
        ],
    }
    states = [inst("e"), inst("c", "center", "center", model="big")]
    p, _ = planner(states)
    d = p.plan(hard, EAST, "u")
    assert d.classification is not None
    assert d.classification.difficulty == "hard"
    assert [c.id for c in d.candidates] == ["c", "e"]
    d = p.plan({**SIMPLE, "model": "big"}, EAST, "u")
    assert [c.id for c in d.candidates] == ["c"]
    with pytest.raises(ModelNotFound):
        p.plan({**SIMPLE, "model": "nope"}, EAST, "u")
    p, _ = planner([])
    with pytest.raises(NotReady):
        p.plan(SIMPLE, EAST, "u")


def test_canary_split_is_sticky_and_close_to_its_share() -> None:
    shares = {"v1": 0.9, "v2": 0.1}
    picks = Counter(canary_version(shares, f"user-{i}") for i in range(2000))
    assert 120 < picks["v2"] < 280
    assert all(canary_version(shares, "alice") == canary_version(shares, "alice") for _ in "ab")
    states = [inst("old"), inst("new", version="v2")]
    p, _ = planner(states, traffic={"m": shares})
    for i in range(50):
        user = f"user-{i}"
        d = p.plan(SIMPLE, EAST, user)
        want = canary_version(shares, f"m:{user}")
        assert [c.state.info.version for c in d.candidates] == [want]
    p, _ = planner([inst("old")], traffic={"m": {"v2": 1.0}})
    assert [c.id for c in p.plan(SIMPLE, EAST, "x").candidates] == ["old"]  # fallback
    # A center serving the same model name under its own version is outside the split.
    center = inst("c", "center", "center", version="fp8")
    p, _ = planner([inst("old"), inst("new", version="v2"), center], traffic={"m": shares})
    for i in range(20):
        ids = {c.id for c in p.plan(SIMPLE, EAST, f"user-{i}").candidates}
        assert "c" in ids
        assert len(ids & {"old", "new"}) == 1


def test_breaker_opens_half_opens_for_one_probe_and_closes() -> None:
    now = 0.0  # the tracker's clock: it reads this variable
    t = Tracker(BreakerSettings(failures=2, open_s=10, max_open_s=60), clock=lambda: now)
    t.failure("a")
    assert t.available("a")
    t.failure("a")
    assert t.stats("a").circuit is Circuit.OPEN
    now = 5.0
    assert not t.available("a")
    now = 10.5
    assert t.available("a")  # a probe may go; reading it changes nothing
    assert t.stats("a").circuit is Circuit.OPEN
    t.acquire("a")
    assert t.stats("a").circuit is Circuit.HALF_OPEN
    now = 10.6
    assert not t.available("a")  # one probe at a time
    now = 11.0
    t.failure("a")
    assert t.stats("a").open_for == 20  # reopened for twice as long
    now = 30.5
    assert not t.available("a")  # opened at 11 for 20 s
    now = 31.5
    assert t.available("a")
    t.acquire("a")
    t.success("a", 12.0)
    assert t.stats("a").circuit is Circuit.CLOSED
    assert t.available("a")
