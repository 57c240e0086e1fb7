"""The sequences running in the batching engine's slots, and the step that
advances them all.

Each step:

1. builds one batch: the next token of every decoding sequence, then up to
   ``chunk_tokens`` prompt tokens of prefilling sequences (chunked prefill:
   a long prompt is spread over several steps instead of stalling everyone),
   the budget first to the fewest prompt tokens left (``shortest_first``;
   ties, or off, in admission order: first come, first served held short
   questions 5-15 s behind documents admitted just before them);
2. runs one ``llama_decode`` and samples, per sequence, with its own chain;
   text goes to the job's sink (which hands it to the event loop). A step
   that finishes some prompts and only begins or continues others reads them
   in two calls: first the decoding sequences' tokens and the prompts it
   finishes, which are sampled at once, then the other prompts' chunks.
   Their first tokens then wait for their own tokens, not for the chunk's
   end: under a 32-stream overload a 16-token question placed beside a long
   prompt's chunk waited 0.8 s for a step that read 128 tokens. Here a step
   of two decoding sequences, a 16-token prompt's end and 110 tokens of
   another took 466 ms as one call, 80 ms and 366 ms as two.
   An answer that has sent its client no text yet (this model spells a
   Chinese character in two or three tokens, and a client's first token is
   its first text) is read on at once, in calls of its own (up to three)
   before the step's other calls; while one has none, a step reads its
   decoders first, in a call of their own. Under the overload a Chinese
   question's prompt was read in the first call of a step that began 0.86 s
   after it arrived; its first character left 1.7 s after that, two steps of
   a long prompt's chunks on, together with that prompt's own first token
   (2.6 s). On an idle engine (one thread), a Chinese question 20 ms after a
   230-word prompt had its first character after 0.91-1.18 s where it had
   1.47-1.61 s in five of six trials; a call of one to four decoders costs
   ~20-50 ms on this CPU.

A finished sequence leaves its tokens in its slot's cache for prefix reuse;
a cancelled one (client gone) has its cache dropped.

Everything here runs on the scheduler's worker thread.
"""

from __future__ import annotations

import time

from servekit.engine.batching_jobs import Seq
from servekit.engine.batching_llama import BatchItem, LlamaBatchModel
from servekit.engine.batching_slots import Slot
from servekit.engine.batching_stats import BatchingStats
from servekit.engine.prompt_estimate import PromptEstimator
from servekit.engine.protocol import Finish, TextDelta
from servekit.errors import EngineFailure
from servekit.wire import FinishReason

__all__ = ["Batch"]


class Batch:
    """The slots of a loaded model and the sequences running in them."""

    def __init__(
        self,
        model: LlamaBatchModel,
        *,
        chunk_tokens: int,
        shortest_first: bool,
        stats: BatchingStats,
        estimator: PromptEstimator,
    ) -> None:
        self.model = model
        self.slots = [Slot[Seq](i) for i in range(model.n_slots)]
        self.running: list[Seq] = []  # admission order
        self._chunk = chunk_tokens
        self._shortest_first = shortest_first
        self._stats = stats
        self._estimator = estimator
        self._last_decode: float | None = None  # when the last decode-only step began

    def idle(self) -> None:
        """Nothing runs: the wait for the next job is no token's cost."""
        self._last_decode = None

    def add(self, seq: Seq) -> None:
        """A sequence takes its slot and joins the next step."""
        seq.slot.seq = seq
        self.running.append(seq)
        self._stats.running = len(self.running)
        self._note_backlog()

    def _note_backlog(self) -> None:
        # What a newcomer's prefill waits behind (all of it first-come first-served;
        # with shortest first, the prompts with no more tokens left than its own).
        # Noted wherever it changes (a sequence admitted, a step's bookkeeping, a
        # sequence leaving), so it is current before a step that may take a
        # second and before an event reaches its client: a client that saw its
        # answer end must never read its prompt as still pending.
        remaining = tuple(len(seq.prompt) - seq.n_past for seq in self.running if seq.prefilling)
        self._stats.prefill_remaining = remaining if self._shortest_first else ()
        self._stats.prefill_backlog_tokens = sum(remaining)
        self._stats.slot_work = tuple(
            (len(seq.prompt) - seq.n_past, seq.max_new - seq.generated, seq.open_ended)
            for seq in self.running
        )

    def reap_cancelled(self) -> None:
        """Free the slots of cancelled sequences, dropping their cache."""
        for seq in [s for s in self.running if s.job.cancelled]:
            self._release(seq, keep_cache=False)
            self._stats.requests_cancelled += 1

    def step(self) -> None:
        """Build one batch of the running sequences, decode it and sample."""
        # Prefill budget to the fewest tokens left first (or first-come first-served,
        # see the module docstring); the batch itself in slot order (see
        # batching_slots: consecutive sequence ids share one pass over the
        # weights), each sequence's tokens together.
        budget = self._chunk
        takes: dict[int, int] = {}
        order = self.running
        if self._shortest_first:  # sorted() is stable: ties keep admission order
            order = sorted(order, key=lambda s: len(s.prompt) - s.n_past)
        for seq in order:
            if budget <= 0:
                break
            if seq.prefilling:
                takes[id(seq)] = take = min(budget, len(seq.prompt) - seq.n_past)
                budget -= take
        # Each sequence's tokens, in slot order, in up to three calls (see the
        # module docstring): the decoders alone while one of them has sent no text
        # yet, the prompts this step finishes, the other prompts' chunks.
        running = sorted(self.running, key=lambda s: s.slot.seq_id)
        decoders = _next_tokens([seq for seq in running if seq.next_token is not None])
        ending: list[Part] = []
        chunks: list[Part] = []
        for seq in running:
            seq_id = seq.slot.seq_id
            if seq.next_token is not None:
                continue
            take = takes.get(id(seq), 0)
            if not take:
                continue
            last = len(seq.prompt) - 1
            read = [
                BatchItem(seq.prompt[j], j, seq_id, j == last)
                for j in range(seq.n_past, seq.n_past + take)
            ]
            (ending if read[-1].logits else chunks).append((seq, read))
        decoding = [seq for seq, _ in decoders]
        finishing = [seq for seq, _ in ending]
        calls = _calls(decoders, ending, chunks)
        prefill_tokens = sum(len(read) for _, read in ending + chunks)
        started = time.perf_counter()
        # What a token costs a decoding sequence is the time from one decode-only
        # step to the next, its sampling and the worker's bookkeeping included:
        # under overload that was half as much again as llama_decode alone.
        previous, self._last_decode = self._last_decode, None if prefill_tokens else started
        self._stats.step_in_flight = (time.monotonic(), prefill_tokens)
        try:
            extra = 0
            while calls:
                items, sampled = calls.pop(0)
                self.model.decode(items)
                self._advance(items, takes)
                for seq in sampled:  # its logits, before the next call replaces them
                    self._sample(seq)
                # An answer that has sent no text yet goes on before the calls left.
                textless = [s for s in sampled if s in self.running and not s.said]
                if calls and textless and extra < _TEXT_CALLS:
                    extra += 1
                    calls.insert(0, _calls(_next_tokens(textless), [], [])[0])
        except EngineFailure as exc:
            self._stats.step_in_flight = None
            for seq in list(self.running):
                self._fail(seq, exc)
            return
        self._stats.record_step(
            len(decoding) + len(finishing) + len(chunks),
            len(decoding),
            prefill_tokens,
            time.perf_counter() - started,
            period=None if previous is None or prefill_tokens else started - previous,
        )
        self._stats.step_in_flight = None  # after the backlog counts what it read

    def _advance(self, items: list[BatchItem], takes: dict[int, int]) -> None:
        """Cache bookkeeping for every token a call read, noted before any of its
        tokens reaches a client."""
        for it in items:
            slot = self.slots[it.seq]
            slot.cached.append(it.token)
            assert slot.seq is not None
            slot.seq.n_past = it.pos + 1
        for seq in {self.slots[it.seq].seq for it in items}:
            if seq is not None and id(seq) in takes:
                # A newcomer sharing its prompt copies what is read.
                self._estimator.prefilled(seq.slot.seq_id, min(1.0, seq.n_past / len(seq.prompt)))
        self._note_backlog()

    def _sample(self, seq: Seq) -> None:
        # Token accounting, text and finish reasons follow the single-sequence engine.
        token = seq.sampler.sample(self.model.ctx, seq.out_index)
        if seq.next_token is None:  # the first token: prefill just ended
            now = time.monotonic()
            self._stats.record_ttft(
                now - seq.started,
                running=seq.others,
                prefilled=len(seq.prompt) - seq.cached_prompt,
                from_arrival=now - seq.since,
            )
        if self.model.is_eog(token):
            self._finish(seq, "stop")
            return
        seq.generated += 1
        seq.unsent += 1
        text = seq.text.push(self.model.piece(token))
        if text:
            seq.said.append(text)
            seq.job.emit(TextDelta(text, seq.unsent))
            seq.unsent = 0
        if seq.text.stopped:
            self._finish(seq, "stop")
        elif seq.generated >= seq.max_new:
            self._finish(seq, "length")
        else:
            seq.next_token = token

    def _finish(self, seq: Seq, reason: FinishReason) -> None:
        # Release first, so that load() never counts a sequence its client saw finish.
        self._release(seq, keep_cache=True)
        self._stats.requests_ok += 1
        if seq.open_ended:  # an answer's own length, not one cut at a client's max_tokens
            self._stats.record_completion(seq.generated)
        tail = seq.text.flush()
        if tail or seq.unsent:
            seq.job.emit(TextDelta(tail, seq.unsent))
        # What the slot keeps: the prompt and this answer, the next turn's history.
        self._estimator.answered(seq.slot.seq_id, seq.job.request, "".join([*seq.said, tail]))
        seq.job.emit(Finish(reason, len(seq.prompt), seq.generated, seq.cached_prompt))

    def _fail(self, seq: Seq, exc: BaseException) -> None:
        self._release(seq, keep_cache=False)
        self._stats.requests_failed += 1
        seq.job.emit(exc)

    def _release(self, seq: Seq, *, keep_cache: bool) -> None:
        seq.sampler.close()
        slot = seq.slot
        if not keep_cache:
            self.model.forget(slot.seq_id)
            slot.cached = []
            self._estimator.hold(slot.seq_id, "")
        slot.seq = None
        slot.last_used = time.monotonic()
        self.running.remove(seq)
        self._stats.running = len(self.running)
        self._note_backlog()

    def fail_all(self, exc: BaseException) -> None:
        """Every running sequence fails with ``exc`` (its cache is dropped)."""
        for seq in list(self.running):
            self._fail(seq, exc)


Part = tuple[Seq, list[BatchItem]]

# Calls a step may add for answers that have sent no text yet (a UTF-8
# character is at most four bytes, so three more tokens end any character).
_TEXT_CALLS = 3


def _next_tokens(seqs: list[Seq]) -> list[Part]:
    """Each decoding sequence's next token, to be read (its logits wanted)."""
    parts: list[Part] = []
    for seq in seqs:
        assert seq.next_token is not None
        parts.append((seq, [BatchItem(seq.next_token, seq.n_past, seq.slot.seq_id, True)]))
    return parts


def _calls(
    decoders: list[Part], ending: list[Part], chunks: list[Part]
) -> list[tuple[list[BatchItem], list[Seq]]]:
    """A step's ``llama_decode`` calls, each with the sequences sampled after it
    (see the module docstring): the decoders (alone while one of them has sent no
    text yet and the step reads prompt tokens), the prompts the step finishes (with
    the decoders otherwise), the other prompts' chunks (apart when some prompt
    finishes). Each call keeps its sequences in slot order."""
    groups: list[list[Part]] = []
    lead = any(not seq.said for seq, _ in decoders) and bool(ending or chunks)
    if lead:
        groups.append(decoders)
        decoders = []
    if ending and chunks:
        groups += [sorted(decoders + ending, key=_slot), chunks]
    else:
        groups.append(sorted(decoders + ending + chunks, key=_slot))
    calls: list[tuple[list[BatchItem], list[Seq]]] = []
    for group in groups:
        if not group:
            continue
        items: list[BatchItem] = []
        sampled: list[Seq] = []
        for seq, read in group:
            items.extend(read)
            if read[-1].logits:
                seq.out_index = len(items) - 1
                sampled.append(seq)
        calls.append((items, sampled))
    return calls


def _slot(part: Part) -> int:
    return part[0].slot.seq_id
