"""A job's prompt tokens still to prefill, guessed before the worker tokenizes it.

The batching worker tokenizes a job when the step in flight ends (a step may
take a second). A burst that arrives meanwhile would be admitted against a
backlog that does not show it yet: on a cold edge two 490-token prompts were
admitted in one instant and the second waited 9.5 s behind the first. So each
job is priced as it is submitted, from its text alone: the characters it does
not share with the prompt a slot holds (the longest common prefix of the
texts: a system prompt or a conversation's history), at the characters per
token of the prompts the worker has tokenized.

A slot holds its prompt only as far as it has read it: a prompt admitted a
moment ago is still being prefilled, and a newcomer sharing its text (the
same system prompt, in a burst) copies only the part read so far and reads
the rest itself. Counting the whole text as held priced 491-token prompts at
77-117 ms of own prefill; they found 5 tokens cached and took 5 s. So each
slot's text counts up to the share of its prompt tokens read
(:meth:`PromptEstimator.prefilled`, proportionally in characters), and so do
the block names the load report shows routers: a report polled while a
hedged attempt was prefilling named the whole customer-service prompt, the
router then believed the edge held it, sent the next request there first
(predicted 150 ms, cold: 3.5 s), its hedge to the center won and cancelled
the prefill, and the next poll caught the next attempt prefilling: nine
requests in a row through ``up --netem`` took 1.2-1.3 s at the center.

A finished slot keeps the answer's tokens beside its prompt's, and a
conversation's next turn sends that answer back as history: on ShareGPT-like
chat through ``hybrid-llm up`` a second turn found 71 of its 89 tokens cached
(its first turn's 40 and 31 of the 32 answered). So once a sequence finishes,
its slot holds the prompt with the answer appended as an assistant turn
(:meth:`PromptEstimator.answered`), in the text and in the block names the
load report shows routers; without it a next turn was priced, and reported,
as if only its first turn's prompt were held.

The worker writes (what each slot holds, the measured ratio), the event loop
reads; every write rebinds one reference, so a reader sees an old or a new
value, never a torn one. It is a guess: a chat template's own tokens, a slot
the scheduler will not choose, text that tokenizes unevenly.
"""

from __future__ import annotations

import dataclasses
import math

from servekit.engine.protocol import GenerationRequest, Message
from servekit.prefix_blocks import chained_names, conversation_text, sampled, scope_seed

__all__ = ["PromptEstimator", "common_text_prefix", "request_blocks", "request_text"]

# Before any prompt was tokenized (English prose runs about four characters a
# token; the warm-up replaces this within its first request).
DEFAULT_CHARS_PER_TOKEN = 4.0
# How much of the measured ratio each new prompt replaces, by its length: the
# sums decay so that a change of language shows within a few dozen prompts.
_DECAY = 0.9
_BLOCK = 4096  # characters compared at once by common_text_prefix


def request_text(request: GenerationRequest) -> str:
    """The text a request's prompt is made of, in order (roles mark the turns)."""
    if request.messages is not None:
        return "".join(f"\n{m.role}\n{m.content}" for m in request.messages)
    return request.prompt or ""


def request_blocks(request: GenerationRequest, block_chars: int) -> tuple[int, ...]:
    """The chained block names of a chat request's messages in its cache scope, as
    routers name them (``servekit.prefix_blocks``); none for a raw completion prompt
    or ``block_chars`` 0."""
    if request.messages is None or block_chars <= 0:
        return ()
    text = conversation_text((m.role, m.content) for m in request.messages)
    return tuple(chained_names(text, block_chars, scope_seed(request.cache_salt)))


def common_text_prefix(a: str, b: str) -> int:
    """Length of the longest common prefix of two strings. Compared a block at a
    time (slices compare in C), then by halving inside the first block that
    differs: a character loop over a pasted document would cost the event loop
    a millisecond per slot, and halving the whole string copies it each time."""
    n = min(len(a), len(b))
    lo = 0
    while lo < n:
        hi = min(n, lo + _BLOCK)
        if a[lo:hi] != b[lo:hi]:
            break
        lo = hi
    else:
        return n
    # a[:lo] is common, a[:hi] is not
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if a[lo:mid] == b[lo:mid]:
            lo = mid
        else:
            hi = mid
    return lo


class PromptEstimator:
    """Uncached prompt tokens of a job from its text (see the module docstring)."""

    def __init__(self, slots: int, block_chars: int = 0) -> None:
        self._block_chars = block_chars  # the size of the block names reported (0: none)
        self._held: list[str] = [""] * slots  # per slot: the text of the prompt it caches
        self._read: list[int] = [0] * slots  # and how many of its characters are read
        self._salts: list[str | None] = [None] * slots  # and its cache scope
        self._blocks: list[tuple[int, ...]] = [()] * slots  # and its chained block names
        # and, once answered, how many of them its prompt made (its end is reported too)
        self._prompt_blocks: list[int] = [0] * slots
        self._report: tuple[int, tuple[int, ...]] | None = None  # (stride, held_blocks())
        self._chars = 0.0
        self._tokens = 0.0
        self.chars_per_token = DEFAULT_CHARS_PER_TOKEN

    def uncached_tokens(self, text: str, salt: str | None = None) -> int:
        """Tokens of ``text`` no slot of scope ``salt`` is likely to hold; at least one
        (the last prompt token is always evaluated again). Another scope's slots do
        not count: the price decides admission, which a prober could watch."""
        shared = max(
            (
                min(read, common_text_prefix(text, held))
                for held, read, held_salt in zip(self._held, self._read, self._salts, strict=True)
                if held_salt == salt
            ),
            default=0,
        )
        return max(1, math.ceil((len(text) - shared) / self.chars_per_token))

    # -- the worker --------------------------------------------------------

    def tokenized(self, text: str, tokens: int) -> None:
        """A prompt of ``len(text)`` characters came to ``tokens`` tokens."""
        if tokens <= 0 or not text:
            return
        self._chars = _DECAY * self._chars + len(text)
        self._tokens = _DECAY * self._tokens + tokens
        self.chars_per_token = self._chars / self._tokens

    def held_blocks(self, stride: int) -> tuple[int, ...]:
        """Block names of what the slots hold, every ``stride``-th and each slot's last,
        each slot's only as far as it has read its prompt (see the module docstring)."""
        report = self._report
        if report is None or report[0] != stride:  # a load report asks on every request
            names = tuple(
                name
                for blocks, end, text, read in zip(
                    self._blocks, self._prompt_blocks, self._held, self._read, strict=True
                )
                for name in _with_end(
                    sampled(blocks[: _blocks_read(len(blocks), text, read)], stride), blocks, end
                )
            )
            report = self._report = (stride, names)
        return report[1]

    def hold(
        self,
        slot: int,
        text: str,
        blocks: tuple[int, ...] = (),
        salt: str | None = None,
        *,
        read: float = 1.0,
    ) -> None:
        """Slot ``slot`` now caches the prompt of ``text`` ("" once it is emptied)
        whose block names are ``blocks``, in the cache scope ``salt``; ``read`` of its
        prompt tokens are in the cache already (see :meth:`prefilled`)."""
        self._read[slot] = 0  # never more than read while the text changes
        self._held[slot] = text
        self._read[slot] = _chars_read(text, read)
        self._blocks[slot] = blocks
        self._prompt_blocks[slot] = 0
        self._salts[slot] = salt
        self._report = None

    def answered(self, slot: int, request: GenerationRequest, answer: str) -> None:
        """Slot ``slot`` finished ``request`` with ``answer`` and keeps both: it now
        holds the conversation with the answer as its last assistant turn (a
        continued one: appended to it), as the next turn will send it."""
        messages = request.messages
        if messages is None or not answer:
            return
        if request.continue_final_message and messages and messages[-1].role == "assistant":
            said = Message("assistant", messages[-1].content + answer)
            held = (*messages[:-1], said)
        else:
            held = (*messages, Message("assistant", answer))
        whole = dataclasses.replace(request, messages=held, continue_final_message=False)
        blocks = request_blocks(whole, self._block_chars)
        prompt_blocks = len(self._blocks[slot])
        self.hold(slot, request_text(whole), blocks, request.cache_salt)
        # The prompt's own end is named too: a repeat of the prompt (the same question
        # again) is vouched for to its last block, not to the sample before it (one
        # every ``stride``): without it, whole-prompt repeats were credited 40-50
        # tokens short, priced as prefills at 333-532 ms, and took 29-42.
        self._prompt_blocks[slot] = prompt_blocks

    def prefilled(self, slot: int, read: float) -> None:
        """Slot ``slot`` has read the share ``read`` of its prompt's tokens."""
        self._read[slot] = _chars_read(self._held[slot], read)
        self._report = None


def _with_end(picked: list[int], blocks: tuple[int, ...], end: int) -> list[int]:
    """``picked`` and the name that ends the first ``end`` of ``blocks``, if missing."""
    if 0 < end <= len(blocks) and blocks[end - 1] not in picked:
        return [*picked, blocks[end - 1]]
    return picked


def _blocks_read(blocks: int, text: str, read: int) -> int:
    """Of a slot's ``blocks``, those within the ``read`` characters of its ``text``."""
    return blocks if read >= len(text) else blocks * read // len(text)


def _chars_read(text: str, read: float) -> int:
    return len(text) if read >= 1.0 else int(len(text) * max(0.0, read))
