"""Slots of the batching engine, and which one a new prompt takes.

llama.cpp keeps one KV stream per sequence id when ``kv_unified`` is off, and
then splits a batch into micro-batches of *consecutive, increasing* sequence
ids (``llama_batch_allocr::split_equal`` with ``sequential``). Every
micro-batch reads all the model's weights again: on this CPU a batch of
sequences {0, 1, 3, 4} costs two passes where {0, 1, 2, 3} costs one. So the
scheduler orders each batch by slot, and a new prompt goes where it keeps the
running slots in as few consecutive runs as possible, unless another slot
already holds a long stretch of its prompt. Among the rest, it prefers the
slot where it keeps the most cached tokens and throws away the fewest: a short
shared preamble is no reason to evict a long cached conversation that an empty
slot would have spared. The chosen slot need not prefill what another slot
holds, though: :func:`donor` names a slot whose cache to copy in first
(``llama_memory_seq_cp`` copies a whole KV stream, a few ms on this CPU, where
prefilling a chat template's preamble on one core costs hundreds).

A free slot that holds the longest cached prefix of a prompt still waiting
for a slot is *spoken for* (:func:`spoken_for`): another prompt placed in the
same pass does not take it unless no other slot is free (or it reuses that
cache itself). Admission priced the
waiting prompt as cached; under overload a question placed just before it
took the one slot holding its 477-token system prompt (the run-keeping choice
above), and it prefilled 491 tokens instead of 14, 4.6 s, stalling the
sequences beside it.

A slot's cache is reused only by a prompt of the same cache scope (the
request's ``cache_salt``: :func:`reusable`), like vLLM's salted prefix
cache: otherwise a tenant could time a guessed text, or read
``cached_tokens``, to learn that another tenant sent it.

:func:`place` is the whole choice the scheduler makes for one prompt: its
slot and the slot to copy from.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import dataclass, field
from typing import Generic, TypeVar

__all__ = [
    "COPY_MIN_TOKENS",
    "REUSE_MIN_TOKENS",
    "Placement",
    "Slot",
    "choose_slot",
    "common_prefix",
    "donor",
    "place",
    "reusable",
    "runs",
    "spoken_for",
]

# A cached prefix at least this long beats keeping the batch in one run:
# prefilling it again costs more than a split batch for one request's life.
REUSE_MIN_TOKENS = 64

# Copying another slot's cache pays when it spares at least this many tokens
# of prefill (a stream copy costs about what a few tokens of prefill do).
COPY_MIN_TOKENS = 16

SeqT = TypeVar("SeqT")


@dataclass(eq=False)
class Slot(Generic[SeqT]):
    seq_id: int
    cached: list[int] = field(default_factory=list)
    seq: SeqT | None = None  # the sequence running in it, if any
    last_used: float = 0.0
    salt: str | None = None  # the cache scope of what it holds


def reusable(slot: Slot[SeqT], prompt: Sequence[int], salt: str | None) -> int:
    """Leading tokens of ``prompt`` the slot's cache may serve: none for another scope."""
    return common_prefix(slot.cached, prompt) if slot.salt == salt else 0


def common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    n = min(len(a), len(b))
    i = 0
    while i < n and a[i] == b[i]:
        i += 1
    return i


def runs(ids: Collection[int]) -> int:
    """How many runs of consecutive ids ``ids`` falls into: micro-batches per step."""
    return sum(1 for i in ids if i - 1 not in ids)


def choose_slot(
    free: Sequence[Slot[SeqT]],
    busy: Collection[int],
    prompt: Sequence[int],
    salt: str | None = None,
) -> Slot[SeqT]:
    """The free slot for ``prompt`` of scope ``salt``, given the ids of the slots
    already running.

    A long cached prefix wins (the longest); otherwise the slot that leaves the
    fewest runs, then the most shared minus evicted cached tokens, then the
    least recently used.
    """
    busy_set = set(busy)

    def key(slot: Slot[SeqT]) -> tuple[int, int, int, float]:
        shared = reusable(slot, prompt, salt)
        long_reuse = shared if shared >= REUSE_MIN_TOKENS else 0
        kept = shared - (len(slot.cached) - shared)
        return (long_reuse, -runs(busy_set | {slot.seq_id}), kept, -slot.last_used)

    return max(free, key=key)


def donor(
    slots: Sequence[Slot[SeqT]],
    chosen: Slot[SeqT],
    prompt: Sequence[int],
    salt: str | None = None,
) -> tuple[Slot[SeqT], int] | None:
    """The slot whose cache ``chosen`` should copy before taking ``prompt``, if any.

    The one of scope ``salt`` sharing the longest prefix with the prompt, if
    that beats what ``chosen`` already holds by at least :data:`COPY_MIN_TOKENS`;
    with how many tokens it shares.
    """
    own = reusable(chosen, prompt, salt)
    best: tuple[Slot[SeqT], int] | None = None
    for slot in slots:
        if slot is chosen:
            continue
        shared = reusable(slot, prompt, salt)
        if shared >= own + COPY_MIN_TOKENS and (best is None or shared > best[1]):
            best = (slot, shared)
    return best


def spoken_for(
    slots: Sequence[Slot[SeqT]], waiting: Sequence[tuple[Sequence[int], str | None]]
) -> set[int]:
    """Ids of the slots that hold the longest cached prefix (at least
    :data:`REUSE_MIN_TOKENS`) of one of the ``waiting`` prompts (tokens, scope)."""
    held: set[int] = set()
    for prompt, salt in waiting:
        best = max(slots, key=lambda slot: reusable(slot, prompt, salt), default=None)
        if best is not None and reusable(best, prompt, salt) >= REUSE_MIN_TOKENS:
            held.add(best.seq_id)
    return held


@dataclass(frozen=True, slots=True)
class Placement(Generic[SeqT]):
    """Where a prompt goes: its ``slot``; ``source``, a slot whose cache the slot
    copies first (:func:`donor`), if any; and ``shared``, the leading prompt tokens
    the slot then holds."""

    slot: Slot[SeqT]
    source: Slot[SeqT] | None
    shared: int


def place(
    slots: Sequence[Slot[SeqT]],
    prompt: Sequence[int],
    salt: str | None,
    waiting: Sequence[tuple[Sequence[int], str | None]] = (),
) -> Placement[SeqT]:
    """Where ``prompt`` of scope ``salt`` goes among the free ``slots`` (those running
    no sequence; one at least must be), with the ``waiting`` prompts (tokens, scope)
    still queued behind it.

    :func:`choose_slot` among the free slots, leaving out those :func:`spoken_for`
    by a waiting prompt unless ``prompt`` reuses that slot's cache itself or no
    other slot is free; then the :func:`donor` to copy from, if any.
    """
    free = [s for s in slots if s.seq is None]
    busy = [s.seq_id for s in slots if s.seq is not None]
    if waiting:
        reserved = spoken_for(slots, waiting)
        mine = [
            s
            for s in free
            if s.seq_id not in reserved or reusable(s, prompt, salt) >= REUSE_MIN_TOKENS
        ]
        free = mine or free
    slot = choose_slot(free, busy, prompt, salt)
    source = donor(slots, slot, prompt, salt)
    if source is None:
        return Placement(slot, None, reusable(slot, prompt, salt))
    return Placement(slot, source[0], source[1])
