"""Slot choice for the batching engine: few micro-batches, long prefixes kept."""

from __future__ import annotations

from servekit.engine.batching_slots import (
    COPY_MIN_TOKENS,
    REUSE_MIN_TOKENS,
    Slot,
    choose_slot,
    common_prefix,
    donor,
    place,
    reusable,
    runs,
    spoken_for,
)


def slots(n: int) -> list[Slot[object]]:
    return [Slot[object](i) for i in range(n)]


def test_runs_counts_consecutive_stretches() -> None:
    assert runs(set()) == 0
    assert runs({0, 1, 2, 3}) == 1
    assert runs({0, 1, 3, 4}) == 2
    assert runs({7, 0, 2, 5}) == 4


def test_common_prefix() -> None:
    assert common_prefix([1, 2, 3], [1, 2, 4]) == 2
    assert common_prefix([], [1]) == 0
    assert common_prefix([1, 2], [1, 2, 3]) == 2


def test_new_prompt_extends_the_running_run() -> None:
    all_slots = slots(8)
    busy = {0, 1, 2}
    free = [s for s in all_slots if s.seq_id not in busy]
    assert choose_slot(free, busy, [5, 6, 7]).seq_id == 3


def test_new_prompt_fills_a_gap() -> None:
    all_slots = slots(8)
    busy = {0, 1, 3, 4}
    free = [s for s in all_slots if s.seq_id not in busy]
    assert choose_slot(free, busy, [5, 6, 7]).seq_id == 2


def test_short_shared_prefix_does_not_split_the_batch() -> None:
    all_slots = slots(8)
    prompt = list(range(100, 140))
    all_slots[6].cached = prompt[:30]  # a chat template's system preamble, say
    busy = {0, 1}
    free = [s for s in all_slots if s.seq_id not in busy]
    assert choose_slot(free, busy, prompt).seq_id == 2


def test_long_cached_prefix_wins_over_contiguity() -> None:
    all_slots = slots(8)
    prompt = list(range(1000, 1000 + REUSE_MIN_TOKENS + 20))
    all_slots[6].cached = prompt[: REUSE_MIN_TOKENS + 10]
    all_slots[5].cached = prompt[:REUSE_MIN_TOKENS]
    busy = {0, 1}
    free = [s for s in all_slots if s.seq_id not in busy]
    assert choose_slot(free, busy, prompt).seq_id == 6


def test_among_equals_the_longer_prefix_then_least_recently_used() -> None:
    all_slots = slots(4)
    all_slots[1].cached = [1, 2]
    all_slots[3].cached = [1, 2, 3]
    # nothing runs: every choice is one run; the longer (short) prefix wins
    assert choose_slot(all_slots, set(), [1, 2, 3, 4]).seq_id == 3
    all_slots[3].cached = [1, 2]
    all_slots[1].last_used, all_slots[3].last_used = 5.0, 2.0
    assert choose_slot([all_slots[1], all_slots[3]], set(), [1, 2, 3, 4]).seq_id == 3


def test_short_shared_preamble_does_not_evict_a_long_cache() -> None:
    all_slots = slots(4)
    preamble = list(range(20))
    long_conversation = preamble + list(range(500, 1500))
    all_slots[0].cached = long_conversation
    other = preamble + list(range(2000, 2030))
    assert choose_slot(all_slots, set(), other).seq_id != 0
    # ...and the conversation coming back still finds its slot.
    assert choose_slot(all_slots, set(), [*long_conversation, 7]).seq_id == 0


def test_a_slot_serves_only_its_own_cache_scope() -> None:
    all_slots = slots(3)
    prompt = list(range(200))
    all_slots[0].cached, all_slots[0].salt = list(prompt), "acme"
    all_slots[2].cached, all_slots[2].salt = prompt[:100], "evil"
    assert reusable(all_slots[0], prompt, "acme") == 200
    assert reusable(all_slots[0], prompt, "evil") == 0
    assert reusable(all_slots[0], prompt, None) == 0
    # evil's own shorter copy, never acme's long one, and no copy of acme's cache
    assert choose_slot(all_slots, set(), prompt, "evil").seq_id == 2
    assert donor(all_slots, all_slots[1], prompt, "evil") == (all_slots[2], 100)
    assert donor(all_slots, all_slots[1], prompt, "other") is None
    assert choose_slot(all_slots, set(), prompt, "acme").seq_id == 0


def test_a_slot_holding_a_waiting_prompts_prefix_is_spoken_for() -> None:
    """Slot 2 alone holds the system prompt a waiting request was priced against;
    slot 3 holds a shorter stretch of it, slot 1 a prefix too short to count."""
    system = list(range(100, 100 + REUSE_MIN_TOKENS * 4))
    all_slots = slots(4)
    all_slots[1].cached = system[: REUSE_MIN_TOKENS - 1]
    all_slots[2].cached = [*system, 7, 8]
    all_slots[3].cached = system[: REUSE_MIN_TOKENS * 2]
    waiting = [([*system, 9], None)]
    assert spoken_for(all_slots, waiting) == {2}
    assert spoken_for(all_slots, [([*system, 9], "tenant-b")]) == set()  # another scope
    assert spoken_for(all_slots, [([1, 2, 3], None)]) == set()
    assert spoken_for(all_slots, []) == set()


def test_place_leaves_a_slot_spoken_for_to_the_prompt_waiting_for_it() -> None:
    """Slot 2 holds the system prompt a waiting request was priced against: a
    newcomer with another prompt takes a free slot beside it, one that shares
    that system prompt may take it, and with no other slot free anyone may."""
    system = list(range(100, 100 + REUSE_MIN_TOKENS * 2))
    all_slots = slots(4)
    all_slots[0].seq = all_slots[1].seq = object()  # running
    all_slots[2].cached = [*system, 7]
    waiting = [([*system, 9], None)]
    assert place(all_slots, [1, 2, 3], None).slot.seq_id == 2  # it keeps one run
    assert place(all_slots, [1, 2, 3], None, waiting).slot.seq_id == 3
    assert place(all_slots, [*system, 5], None, waiting).slot.seq_id == 2
    all_slots[3].seq = object()
    assert place(all_slots, [1, 2, 3], None, waiting).slot.seq_id == 2


def test_place_copies_from_a_slot_that_holds_more_of_the_prompt() -> None:
    prompt = list(range(200, 200 + COPY_MIN_TOKENS * 3))
    all_slots = slots(3)
    all_slots[0].seq = object()  # running, and holding the prompt's first tokens
    all_slots[0].cached = prompt[: COPY_MIN_TOKENS * 2]
    placed = place(all_slots, prompt, None)
    assert (placed.slot.seq_id, placed.source, placed.shared) == (
        1,
        all_slots[0],
        COPY_MIN_TOKENS * 2,
    )
    all_slots[1].cached = prompt[:5]
    placed = place(all_slots, prompt, None)
    assert (placed.slot.seq_id, placed.source, placed.shared) == (
        1,
        all_slots[0],
        COPY_MIN_TOKENS * 2,
    )
    assert place(all_slots, prompt, "tenant-b").source is None  # another scope's cache
    all_slots[1].cached = prompt[: COPY_MIN_TOKENS * 2]
    placed = place(all_slots, prompt, None)
    assert (placed.slot.seq_id, placed.source, placed.shared) == (1, None, COPY_MIN_TOKENS * 2)
