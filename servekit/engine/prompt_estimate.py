"""What each slot of the batching engine holds, in the words routers use.

A router credits a request with the blocks of its conversation an instance
holds (``servekit.prefix_blocks``); the batching engine's load report names
them (:meth:`PromptEstimator.held_blocks`). The engine itself prices a request
on its real tokens against the slots' caches
(:meth:`servekit.engine.batching_sched.Scheduler.uncached`); this module keeps
only what a report says.

A slot holds its prompt only as far as it has read it: a prompt admitted a
moment ago is still being prefilled, and a newcomer sharing its text (the
same system prompt, in a burst) copies only the part read so far and reads
the rest itself. So each slot's block names count up to the share of its
prompt tokens read (:meth:`PromptEstimator.prefilled`, proportionally in
characters): a report polled while a
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
(:meth:`PromptEstimator.answered`) in the block names the load report shows
routers; without it a next turn was reported as if only its first turn's
prompt were held.

The worker writes, the event loop reads; every write rebinds one reference,
so a reader sees an old or a new value, never a torn one.
"""

from __future__ import annotations

import dataclasses

from servekit.engine.protocol import GenerationRequest, Message
from servekit.prefix_blocks import chained_names, conversation_text, sampled, scope_seed

__all__ = ["PromptEstimator", "request_blocks", "request_text"]


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


class PromptEstimator:
    """What each slot holds, as its load report names it (see the module docstring)."""

    def __init__(self, slots: int, block_chars: int = 0) -> None:
        self._block_chars = block_chars  # the size of the block names reported (0: none)
        self._held: list[str] = [""] * slots  # per slot: the text of the prompt it caches
        self._read: list[int] = [0] * slots  # and how many of its characters are read
        self._blocks: list[tuple[int, ...]] = [()] * slots  # and its chained block names
        # and, once answered, how many of them its prompt made (its end is reported too)
        self._prompt_blocks: list[int] = [0] * slots
        self._report: tuple[int, tuple[int, ...]] | None = None  # (stride, held_blocks())

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
        *,
        read: float = 1.0,
    ) -> None:
        """Slot ``slot`` now caches the prompt of ``text`` ("" once it is emptied)
        whose block names are ``blocks`` (named in its cache scope); ``read`` of its
        prompt tokens are in the cache already (see :meth:`prefilled`)."""
        self._read[slot] = 0  # never more than read while the text changes
        self._held[slot] = text
        self._read[slot] = _chars_read(text, read)
        self._blocks[slot] = blocks
        self._prompt_blocks[slot] = 0
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
        self.hold(slot, request_text(whole), blocks)
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
