"""What the batching scheduler measures, and the snapshot it hands out.

The worker thread records; any thread may take a :meth:`BatchingStats.snapshot`
(one lock, held for microseconds). The edge agent exports the snapshot as
metrics; the engine's ``load()`` derives its :class:`LoadReport` from it.

``busy_ms_per_seq``, what each running sequence adds to a new request's TTFT
beyond its own prefill, is fitted from the admissions recorded here
(:mod:`servekit.engine.busy_slowdown`).
"""

from __future__ import annotations

import statistics
import threading
import time
from collections import deque
from dataclasses import dataclass, field

from servekit.engine.busy_slowdown import BusySlowdown
from servekit.engine.rates import percentile
from servekit.engine.slot_release import MIN_COMPLETIONS, TYPICAL_ANSWER_TOKENS

__all__ = ["BATCH_SIZE_BUCKETS", "STEP_SAMPLES", "BatchingSnapshot", "BatchingStats"]

# Upper bounds of the batch-size histogram (sequences per decode step).
BATCH_SIZE_BUCKETS: tuple[int, ...] = (1, 2, 4, 8, 16, 32, 64)
# Rates are averaged over this many seconds of recent steps.
RATE_WINDOW_S = 10.0
# Recent decode steps of one batch size that price a step of that size.
STEP_SAMPLES = 8


@dataclass(frozen=True, slots=True)
class BatchingSnapshot:
    """Counters since start plus current and recent figures."""

    slots: int
    running: int
    waiting: int
    prefill_backlog_tokens: int  # prompt tokens of running sequences not yet prefilled
    steps: int
    busy_seconds: float  # inside llama_decode
    decode_tokens: int
    prefill_tokens: int
    prompt_tokens: int
    reused_prompt_tokens: int
    admitted: int  # requests that got a slot (warmup included)
    prefix_copies: int  # admissions that started from a copy of another slot's cache
    last_batch_sequences: int
    last_batch_tokens: int
    batch_sequences_total: int  # summed over steps; / steps = mean batch size
    mean_batch_sequences: float
    # Cumulative counts of steps with at most BATCH_SIZE_BUCKETS[i] sequences.
    batch_size_counts: tuple[int, ...]
    ttft_p50_ms: float | None
    ttft_p95_ms: float | None
    ttft_p99_ms: float | None
    busy_ms_per_seq: float | None  # ms per running sequence, see servekit.engine.busy_slowdown
    decode_tokens_per_s: float | None
    prefill_tokens_per_s: float | None
    requests_ok: int
    requests_failed: int
    requests_cancelled: int


@dataclass
class BatchingStats:
    """Mutable counters owned by the scheduler."""

    slots: int
    running: int = 0
    waiting: int = 0
    prefill_backlog_tokens: int = 0
    # Per prefilling sequence when prefill goes shortest first (else empty): what
    # goes before a newcomer (BatchingLlamaEngine.prefill_backlog_ahead_ms).
    prefill_remaining: tuple[int, ...] = ()
    # Per running sequence, in admission order: prompt tokens left to prefill,
    # completion tokens left under its budget, and whether its request set no
    # max_tokens (servekit.engine.slot_release).
    slot_work: tuple[tuple[int, int, bool], ...] = ()
    # The step in flight, if any: when it began (monotonic) and the prompt tokens
    # it reads (a newcomer cannot join it: BatchingLlamaEngine.prefill_backlog_ahead_ms).
    step_in_flight: tuple[float, int] | None = None
    steps: int = 0
    busy_seconds: float = 0.0
    decode_tokens: int = 0
    prefill_tokens: int = 0
    prompt_tokens: int = 0  # of admitted requests; reused ones were not prefilled
    reused_prompt_tokens: int = 0
    admitted: int = 0
    prefix_copies: int = 0
    last_batch_sequences: int = 0
    last_batch_tokens: int = 0
    requests_ok: int = 0
    requests_failed: int = 0
    requests_cancelled: int = 0
    _batch_sequences_total: int = 0
    _bucket_counts: list[int] = field(default_factory=lambda: [0] * len(BATCH_SIZE_BUCKETS))
    _ttft_ms: deque[float] = field(default_factory=lambda: deque(maxlen=512))
    _recent: deque[tuple[float, float, int, int]] = field(default_factory=deque)
    # Running sums over _recent (busy s, decode, prefill, busy s of prefilling steps),
    # kept as steps enter and leave it: load() and the admission check read them per
    # request, and summing a 10 s window of steps each time cost ~0.25 ms.
    _window: list[float] = field(default_factory=lambda: [0.0, 0.0, 0.0, 0.0])
    # (sequences, seconds) of recent decode-only steps: the engine's own TPOT.
    _decode_steps: deque[tuple[int, float]] = field(default_factory=lambda: deque(maxlen=4096))
    _busy: BusySlowdown = field(default_factory=BusySlowdown)
    _completions: deque[int] = field(default_factory=lambda: deque(maxlen=64))
    _decode_seq_s: float | None = None  # moving average of a decode step per sequence
    # The last prefill rate the window measured, reported once the window holds no
    # prefill (an idle engine): a cold window would price a burst's backlog at zero.
    _last_prefill_rate: float | None = None
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def record_step(
        self,
        sequences: int,
        decode: int,
        prefill: int,
        seconds: float,
        now: float | None = None,
        *,
        period: float | None = None,
    ) -> None:
        """One ``llama_decode``: ``sequences`` distinct sequences, token counts by kind
        (``now``: monotonic time it ended; a simulation passes its own clock).
        ``period``: for a decode-only step that followed another, the time between
        their starts, what a token costs a decoding sequence (else ``seconds``)."""
        now = time.monotonic() if now is None else now
        with self._lock:
            self.steps += 1
            self.busy_seconds += seconds
            self.decode_tokens += decode
            self.prefill_tokens += prefill
            self.last_batch_sequences = sequences
            self.last_batch_tokens = decode + prefill
            self._batch_sequences_total += sequences
            for i, bound in enumerate(BATCH_SIZE_BUCKETS):
                if sequences <= bound:
                    self._bucket_counts[i] += 1
            self._recent.append((now, seconds, decode, prefill))
            self._add_to_window(seconds, decode, prefill, 1)
            if prefill:
                self._last_prefill_rate = self._window_prefill_rate() or self._last_prefill_rate
            else:
                token_s = seconds if period is None else period
                self._decode_steps.append((sequences, token_s))
                if decode:
                    per_seq = token_s / max(1, sequences)
                    ema = self._decode_seq_s
                    self._decode_seq_s = per_seq if ema is None else 0.9 * ema + 0.1 * per_seq
            while self._recent and now - self._recent[0][0] > RATE_WINDOW_S:
                _, old_s, old_decode, old_prefill = self._recent.popleft()
                self._add_to_window(old_s, old_decode, old_prefill, -1)

    def _add_to_window(self, seconds: float, decode: int, prefill: int, sign: int) -> None:
        w = self._window
        w[0] += sign * seconds
        w[1] += sign * decode
        w[2] += sign * prefill
        if prefill:
            w[3] += sign * seconds

    def _window_prefill_rate(self) -> float | None:
        # From the steps that prefilled (their busy time): a mostly decoding
        # window would otherwise report prompts as absurdly slow to read.
        _, _, prefill, prefill_busy = self._window
        return prefill / prefill_busy if prefill_busy > 0 and prefill >= 16 else None

    def record_ttft(
        self,
        seconds: float,
        *,
        running: int | None = None,
        prefilled: int = 0,
        from_arrival: float | None = None,
    ) -> None:
        """A first token, ``seconds`` after the request got its slot.

        With ``running`` (sequences in other slots when it got its slot) and
        ``prefilled`` (prompt tokens it computed, the cached prefix left out) it
        is also a busy-slowdown sample, of ``from_arrival`` seconds when given
        (counted from the request's arrival, when it found a slot free and
        waited only for the step in flight).
        """
        with self._lock:
            self._ttft_ms.append(seconds * 1000.0)
            if running is not None:
                sample = seconds if from_arrival is None else from_arrival
                self._busy.record(running, prefilled, sample)

    def record_completion(self, tokens: int) -> None:
        """A finished answer of ``tokens`` completion tokens, of a request that set
        no max_tokens (what a typical answer's length is measured on)."""
        with self._lock:
            self._completions.append(tokens)

    def typical_completion(self) -> float:
        """The mean of recent answers' lengths, in tokens (a default until measured)."""
        with self._lock:
            done = self._completions
            if len(done) < MIN_COMPLETIONS:
                return float(TYPICAL_ANSWER_TOKENS)
            return sum(done) / len(done)

    def decode_step(self, sequences: int) -> float | None:
        """How long a decode-only step of ``sequences`` sequences takes: how long each
        of them takes per token while no prompt is being read. The median of the
        recent steps of that many (:data:`STEP_SAMPLES` of them at least), else the
        moving average of a step per sequence times ``sequences`` (a step of four
        costs about four of one on a CPU: pricing every step at a single stream's,
        the releases of an opening burst were predicted at a third of their time)."""
        n = max(1, sequences)
        same: list[float] = []
        with self._lock:
            for k, sec in reversed(self._decode_steps):  # the most recent first
                if k == n:
                    same.append(sec)
                    if len(same) == 4 * STEP_SAMPLES:
                        break
            per_seq = self._decode_seq_s
        if len(same) >= STEP_SAMPLES:
            return statistics.median(same)
        return None if per_seq is None else per_seq * n

    def assume_busy_ms_per_seq(self, ms: float | None) -> None:
        """Report ``ms`` as the busy slowdown until enough admissions measure it
        (a simulated engine that starts from a real engine's load report)."""
        with self._lock:
            self._busy.prior = ms

    def decode_step_seconds(self, sequences: int) -> list[float]:
        """Durations of recent decode-only steps (no prefill) of ``sequences`` sequences."""
        with self._lock:
            return [sec for n, sec in self._decode_steps if n == sequences]

    def prefill_rate(self) -> float | None:
        """The measured prefill rate alone (what ``snapshot()`` reports), without
        the snapshot's sorting: admission asks it per request."""
        with self._lock:
            return self._prefill_rate_locked()

    def _prefill_rate_locked(self) -> float | None:
        return self._window_prefill_rate() or self._last_prefill_rate

    def snapshot(self) -> BatchingSnapshot:
        with self._lock:
            ttft = sorted(self._ttft_ms)
            busy, decode, _, _ = self._window
            mean = self._batch_sequences_total / self.steps if self.steps else 0.0
            return BatchingSnapshot(
                slots=self.slots,
                running=self.running,
                waiting=self.waiting,
                prefill_backlog_tokens=self.prefill_backlog_tokens,
                steps=self.steps,
                busy_seconds=self.busy_seconds,
                decode_tokens=self.decode_tokens,
                prefill_tokens=self.prefill_tokens,
                prompt_tokens=self.prompt_tokens,
                reused_prompt_tokens=self.reused_prompt_tokens,
                admitted=self.admitted,
                prefix_copies=self.prefix_copies,
                last_batch_sequences=self.last_batch_sequences,
                last_batch_tokens=self.last_batch_tokens,
                batch_sequences_total=self._batch_sequences_total,
                mean_batch_sequences=mean,
                batch_size_counts=tuple(self._bucket_counts),
                ttft_p50_ms=percentile(ttft, 0.50),
                ttft_p95_ms=percentile(ttft, 0.95),
                ttft_p99_ms=percentile(ttft, 0.99),
                busy_ms_per_seq=self._busy.ms_per_seq(),
                # Tokens per second of decode time: what the engine does while busy.
                decode_tokens_per_s=decode / busy if busy > 0 and decode else None,
                prefill_tokens_per_s=self._prefill_rate_locked(),
                requests_ok=self.requests_ok,
                requests_failed=self.requests_failed,
                requests_cancelled=self.requests_cancelled,
            )
