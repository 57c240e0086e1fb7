"""The prefix state cache's bookkeeping (no model: states are opaque bytes here)."""

from __future__ import annotations

from servekit.engine.prefix_cache import PrefixStateCache, common_prefix


def state(size: int) -> bytearray:
    return bytearray(size)


def test_common_prefix_counts_equal_leading_tokens() -> None:
    assert common_prefix([1, 2, 3], [1, 2, 4, 5]) == 2
    assert common_prefix([], [1]) == 0
    assert common_prefix([7, 8], [7, 8]) == 2


def test_lookup_returns_the_longest_shared_prefix() -> None:
    cache = PrefixStateCache(capacity_bytes=1000, min_tokens=2)
    cache.store([1, 2, 3, 4], state(10))
    cache.store([1, 2, 9, 9, 9], state(10))
    entry, n = cache.lookup([1, 2, 3, 4, 5, 6])
    assert entry is not None
    assert entry.tokens == (1, 2, 3, 4)
    assert n == 4
    entry, n = cache.lookup([5, 6])
    assert entry is None
    assert n == 0


def test_short_prompts_and_oversized_states_are_not_kept() -> None:
    cache = PrefixStateCache(capacity_bytes=100, min_tokens=4)
    cache.store([1, 2, 3], state(10))
    cache.store([1, 2, 3, 4], state(101))
    assert len(cache) == 0
    assert cache.size_bytes == 0


def test_least_recently_used_states_go_first_past_the_byte_budget() -> None:
    cache = PrefixStateCache(capacity_bytes=100, min_tokens=1)
    cache.store([1], state(40))
    cache.store([2], state(40))
    cache.lookup([1, 5])  # [1] is now the most recently used
    cache.store([3], state(40))
    assert cache.lookup([2])[0] is None
    assert cache.lookup([1])[0] is not None
    assert cache.lookup([3])[0] is not None
    assert cache.size_bytes == 80


def test_storing_the_same_prompt_again_replaces_its_state() -> None:
    cache = PrefixStateCache(capacity_bytes=100, min_tokens=1)
    cache.store([1, 2], state(30))
    cache.store([1, 2], state(50))
    assert len(cache) == 1
    assert cache.size_bytes == 50


def test_a_saved_state_serves_only_its_own_cache_scope() -> None:
    cache = PrefixStateCache(capacity_bytes=1000, min_tokens=2)
    cache.store([1, 2, 3, 4], state(10), "acme")
    cache.store([1, 2], state(10), "evil")
    entry, n = cache.lookup([1, 2, 3, 4, 5], "acme")
    assert entry is not None
    assert (entry.salt, n) == ("acme", 4)
    entry, n = cache.lookup([1, 2, 3, 4, 5], "evil")
    assert entry is not None
    assert (entry.salt, n) == ("evil", 2)
    assert cache.lookup([1, 2, 3, 4, 5]) == (None, 0)
    cache.store([1, 2, 3, 4], state(10))  # the same tokens in another scope: a second entry
    assert len(cache) == 3
