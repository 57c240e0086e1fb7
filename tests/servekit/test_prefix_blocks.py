"""Block names that routers and engines compute alike, and what a report vouches for."""

from __future__ import annotations

import zlib

from servekit.prefix_blocks import chained_names, conversation_text, leading_run, sampled


def test_names_chain_so_one_name_stands_for_its_whole_prefix() -> None:
    a = chained_names("x" * 64 + "y" * 64 + "z" * 10, 64)
    b = chained_names("w" * 64 + "y" * 64, 64)
    assert len(a) == 2  # the trailing partial block has no name
    assert a[1] != b[1]  # the same second block after a different first one
    assert chained_names("x" * 64 + "y" * 64, 64) == a
    # Named by CRC-32 of the UTF-8 text, the same in every process (str hash is salted).
    first, second = chained_names("短" * 40, 16)
    assert first == zlib.crc32(("短" * 16).encode())
    assert second == zlib.crc32(("短" * 16).encode(), first)


def test_a_sampled_report_still_places_the_end_of_a_held_prefix() -> None:
    names = chained_names(conversation_text([("system", "s" * 900), ("user", "q" * 100)]), 64)
    report = sampled(names, 4)
    assert len(report) < len(names) / 3
    assert report[-1] == names[-1]
    assert leading_run(names, set(report)) == len(names)
    longer = chained_names(
        conversation_text([("system", "s" * 900), ("user", "q" * 100 + " more")]), 64
    )
    # a follow-up sharing the first 15 blocks: credited up to the last sampled name within them
    assert 12 <= leading_run(longer, set(report)) <= 15
    assert leading_run(chained_names("other" * 100, 64), set(report)) == 0
