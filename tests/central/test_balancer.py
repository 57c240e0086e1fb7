"""Least-loaded choice and bounded-load prefix affinity."""

from __future__ import annotations

from collections import Counter

from central.balancer import Balancer, Candidate, prefix_key
from central.settings import BalancingSettings
from servekit.engine.protocol import GenerationRequest, Message, SamplingParams

NAMES = ["a", "b", "c"]


def _balancer(**over: object) -> Balancer:
    return Balancer(BalancingSettings.model_validate(over), NAMES)


def _chat(*contents: str) -> GenerationRequest:
    roles = ["system"] + ["user"] * (len(contents) - 1)
    messages = tuple(Message(r, c) for r, c in zip(roles, contents, strict=True))
    return GenerationRequest("id", SamplingParams(), messages=messages)


def test_least_loaded_wins_without_a_prefix() -> None:
    b = _balancer()
    cands = [Candidate("a", 4, inflight=3), Candidate("b", 4, inflight=1), Candidate("c", 4, 2)]
    assert [c.pending for c in cands] == [3, 1, 2]
    assert b.choose(cands, None) == cands[1]


def test_other_clients_traffic_counts() -> None:
    b = _balancer()
    # b looks idle from here but its engine is busy with other clients' work.
    a = Candidate("a", 4, inflight=1)
    busy = Candidate("b", 4, inflight=0, external=7)
    assert b.choose([a, busy], None) == a


def test_load_is_a_share_of_capacity_and_kv_fullness_counts() -> None:
    b = _balancer()
    big = Candidate("a", 256, inflight=20)
    small = Candidate("b", 8, inflight=2)
    assert b.choose([big, small], None) == big
    full = Candidate("a", 256, inflight=20, kv_cache_usage=0.97)
    assert b.choose([full, small], None) == small


def test_idle_replicas_take_turns() -> None:
    b = _balancer()
    cands = [Candidate(n, 1) for n in NAMES]
    picks = Counter(b.choose(cands, None).name for _ in range(30))  # type: ignore[union-attr]
    assert picks == {"a": 10, "b": 10, "c": 10}


def test_no_candidates() -> None:
    assert _balancer().choose([], "key") is None


def test_same_prefix_sticks_to_one_replica_while_load_is_even() -> None:
    b = _balancer()
    cands = [Candidate(n, 8) for n in NAMES]
    for i in range(3):
        key = f"system prompt {i}"
        first = b.choose(cands, key)
        assert all(b.choose(cands, key) == first for _ in range(10))
    # Different prefixes do not all collapse onto one replica.
    keys = [f"tenant-{i} system prompt" for i in range(60)]
    spread = Counter(b.choose(cands, k).name for k in keys)  # type: ignore[union-attr]
    assert len(spread) == 3
    assert min(spread.values()) >= 8


def test_hot_prefix_spills_once_its_home_exceeds_the_bound() -> None:
    b = _balancer(load_bound=0.25)
    key = "a very popular system prompt"
    home = b.choose([Candidate(n, 8) for n in NAMES], key)
    assert home is not None
    # Home has 5 in flight, the others 1 each: total after this request is 8,
    # fair share 8/3, bound ceil(1.25 * 8/3) = 4 < 5 + 1, so it spills.
    loads = {n: (5 if n == home.name else 1) for n in NAMES}
    cands = [Candidate(n, 8, inflight=loads[n]) for n in NAMES]
    spill = b.choose(cands, key)
    assert spill is not None
    assert spill.name != home.name
    # The spill target is the next one on the ring, so it is the same every time.
    assert all(b.choose(cands, key) == spill for _ in range(5))
    # Within the bound the prefix stays home even though home is busier.
    loads = {n: (2 if n == home.name else 1) for n in NAMES}
    cands = [Candidate(n, 8, inflight=loads[n]) for n in NAMES]
    assert b.choose(cands, key).name == home.name  # type: ignore[union-attr]


def test_a_full_home_is_passed_over_while_another_replica_has_room() -> None:
    b = _balancer(load_bound=0.25)
    key = "prefix"
    home = b.choose([Candidate("a", 1), Candidate("b", 1)], key)
    assert home is not None
    other = "b" if home.name == "a" else "a"
    # Within the (1+ε) bound (ceil(1.25 * 2/2) = 2) but already running its one
    # sequence, while the other replica is idle: the request goes there.
    cands = [Candidate(home.name, 1, inflight=1), Candidate(other, 1)]
    assert b.choose(cands, key).name == other  # type: ignore[union-attr]
    # When every replica is full the prefix goes home and queues there.
    cands = [Candidate(home.name, 1, inflight=1), Candidate(other, 1, inflight=1)]
    assert b.choose(cands, key).name == home.name  # type: ignore[union-attr]


def test_unhealthy_home_is_skipped_and_regained() -> None:
    b = _balancer()
    key = "sticky"
    all_up = [Candidate(n, 4) for n in NAMES]
    home = b.choose(all_up, key)
    assert home is not None
    without = [c for c in all_up if c.name != home.name]
    other = b.choose(without, key)
    assert other is not None
    assert other.name != home.name
    assert b.choose(all_up, key) == home


def test_affinity_can_be_switched_off() -> None:
    b = _balancer(prefix_affinity=False)
    cands = [Candidate("a", 4, inflight=2), Candidate("b", 4, inflight=0)]
    assert all(b.choose(cands, "same").name == "b" for _ in range(5))  # type: ignore[union-attr]


def test_prefix_key_is_the_conversation_before_the_newest_message() -> None:
    a = _chat("You are a pirate.", "Where is the gold?")
    b = _chat("You are a pirate.", "Who are you?")
    assert prefix_key(a, 1024) == prefix_key(b, 1024)
    assert prefix_key(_chat("You are a judge.", "Hi"), 1024) != prefix_key(a, 1024)
    single = _chat("Only one message")
    assert prefix_key(single, 1024) == "system\x1fOnly one message\x1e"
    assert prefix_key(a, 5) == "syste"


def test_prefix_key_for_completions() -> None:
    req = GenerationRequest("id", SamplingParams(), prompt="Once upon a time")
    assert prefix_key(req, 4) == "Once"
    assert prefix_key(GenerationRequest("id", SamplingParams(), prompt=""), 4) is None


def test_a_replica_that_refused_ranks_last() -> None:
    b = _balancer()
    busy = Candidate("a", 4, refused=True)
    other = Candidate("b", 4, inflight=3)
    assert b.choose([busy, other], None) == other
    key = "the same long system prompt"
    home = b.choose([Candidate(n, 4) for n in NAMES], key)
    assert home is not None
    rest = [Candidate(n, 4) for n in NAMES if n != home.name]
    chosen = b.choose([Candidate(home.name, 4, refused=True), *rest], key)
    assert chosen is not None
    assert chosen.name != home.name
    # Chosen anyway when every candidate refused.
    assert b.choose([busy], None) == busy
