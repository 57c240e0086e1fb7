"""Names of a conversation's prefix blocks, computed alike by routers and engines.

A conversation is serialized as the engine reads it (each message's role and
text, in order) and cut into blocks of ``block_chars`` characters; block *i*
is named by a CRC-32 chained over blocks 0..*i* (so one name stands for its
whole prefix, as vLLM's chained block hashes do). Every process computes the
same names (Python's ``hash`` of a str is salted per process), so an engine
can report the names of what its slots hold and any router can look a
request's blocks up in that report (``geo_router.prefix_index``).

A cache scope's names start their chain from its salt (:func:`scope_seed`
of the ``cache_salt`` the router gives each tenant's requests), so the same
text sent by two scopes has unrelated names: a router credits an instance
only with what its scope left there, and an engine's report of what its
slots hold says nothing to another scope's lookups. Without a salt the seed
is 0, the names as before.

32 bits: a name that collides with another prefix's credits a cache that is
not there; with a few hundred names per instance that is about one lookup in
ten million, and the cost is one mispredicted prefill.
"""

from __future__ import annotations

import zlib
from collections.abc import Collection, Iterable, Sequence

__all__ = [
    "chained_names",
    "conversation_text",
    "interleaved_union",
    "leading_run",
    "sampled",
    "scope_seed",
]


def conversation_text(turns: Iterable[tuple[str, str]]) -> str:
    """``(role, text)`` turns as one string, the form every block name is taken over."""
    return "".join(f"{role}\x1f{text}\x1e" for role, text in turns)


def scope_seed(cache_salt: str | None) -> int:
    """Where a cache scope's chains start: 0 without a salt, else the salt's CRC-32."""
    return zlib.crc32(cache_salt.encode("utf-8", "surrogatepass")) if cache_salt else 0


def chained_names(text: str, block_chars: int, seed: int = 0) -> list[int]:
    """The chained names of ``text``'s whole blocks (a trailing partial block has
    none), the chain started at ``seed`` (:func:`scope_seed`)."""
    names: list[int] = []
    h = seed
    crc32 = zlib.crc32
    if text.isascii():  # a character is a byte: one encode, blocks are views of it
        data = memoryview(text.encode("ascii"))
        for start in range(0, len(text) - block_chars + 1, block_chars):
            h = crc32(data[start : start + block_chars], h)
            names.append(h)
        return names
    for start in range(0, len(text) - block_chars + 1, block_chars):
        chunk = text[start : start + block_chars]
        h = crc32(chunk.encode("utf-8", "surrogatepass"), h)
        names.append(h)
    return names


def sampled(names: Sequence[int], stride: int) -> list[int]:
    """Every ``stride``-th name and the last: a report ``stride`` times smaller
    that still places the end of a held prefix within ``stride`` blocks."""
    if not names:
        return []
    picked = list(names[stride - 1 :: stride])
    if not picked or picked[-1] != names[-1]:
        picked.append(names[-1])
    return picked


def leading_run(names: Sequence[int], held: Collection[int]) -> int:
    """How many of ``names``' leading blocks ``held`` vouches for: the furthest
    name present (a chained name stands for every block before it)."""
    for i in range(len(names) - 1, -1, -1):
        if names[i] in held:
            return i + 1
    return 0


def interleaved_union(reports: Sequence[Sequence[int]], limit: int) -> tuple[int, ...]:
    """The names of several reports (a gateway's replicas) as one, at most ``limit``:
    taken from each in turn, so a cut leaves every report its first names (each puts
    its most recent prompts first), without repeats."""
    names: dict[int, None] = {}
    for i in range(max((len(r) for r in reports), default=0)):
        for report in reports:
            if i < len(report):
                names[report[i]] = None
                if len(names) >= limit:
                    return tuple(names)
    return tuple(names)
