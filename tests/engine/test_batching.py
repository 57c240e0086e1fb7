"""The batching engine on the real model: scheduling behaviour under concurrency.

Comparisons with the single-sequence engine live in test_batching_parity.py.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import replace
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry, generate_latest

from geo_router.conversation import Turn
from geo_router.prefix_index import PrefixIndex
from servekit.engine.batching import BatchingLlamaEngine, BatchingSettings
from servekit.engine.batching_jobs import Job, Prepared
from servekit.engine.batching_llama import BatchItem, LlamaBatchModel
from servekit.engine.batching_metrics import BatchingCollector
from servekit.engine.batching_sched import Scheduler
from servekit.engine.batching_slots import COPY_MIN_TOKENS
from servekit.engine.batching_stats import BatchingStats
from servekit.engine.prompt_estimate import PromptEstimator
from servekit.engine.protocol import (
    Finish,
    GenerationRequest,
    Message,
    SamplingParams,
    TextDelta,
    uncached_tokens,
)
from servekit.errors import ContextLengthExceeded

pytestmark = [pytest.mark.model, pytest.mark.anyio]

SLOTS = 3
CTX = 512
CHUNK = 32


@pytest.fixture(scope="module")
async def engine(model_path: Path) -> AsyncIterator[BatchingLlamaEngine]:
    eng = BatchingLlamaEngine(
        BatchingSettings(
            model_path=model_path,
            model_name="smollm2",
            slots=SLOTS,
            ctx_per_slot=CTX,
            chunk_tokens=CHUNK,
            n_threads=2,
        )
    )
    await eng.start()
    yield eng
    await eng.aclose()


def chat(text: str, max_tokens: int = 8, **sampling: object) -> GenerationRequest:
    params = SamplingParams(max_tokens=max_tokens, temperature=0.0, **sampling)  # type: ignore[arg-type]
    return GenerationRequest("t", params, messages=(Message("user", text),))


async def collect(
    eng: BatchingLlamaEngine, req: GenerationRequest
) -> tuple[str, Finish, list[float]]:
    """Text, the Finish event, and the arrival time of every text event."""
    parts: list[str] = []
    times: list[float] = []
    finish: Finish | None = None
    async for ev in eng.generate(req):
        if isinstance(ev, TextDelta):
            parts.append(ev.text)
            times.append(time.monotonic())
        else:
            finish = ev
    assert finish is not None
    return "".join(parts), finish, times


async def test_ready_with_a_prefill_rate_measured_on_a_chunk(model_path: Path) -> None:
    """The warm-up prefills a chunk of prompt, so admission can price the first
    burst's prompts at a rate measured on more than a greeting."""
    chunk = 96  # the greeting warm-up alone prefills ~30 tokens (template included)
    eng = BatchingLlamaEngine(
        BatchingSettings(
            model_path=model_path, model_name="smollm2", slots=2, ctx_per_slot=512,
            chunk_tokens=chunk, n_threads=2,
        )
    )  # fmt: skip
    await eng.start()
    try:
        assert eng.stats().prefill_tokens >= chunk
        rate = eng.load().prefill_tokens_per_s
        assert rate is not None
        assert rate > 0
    finally:
        await eng.aclose()


async def _beside_a_document(
    engine: BatchingLlamaEngine,
    monkeypatch: pytest.MonkeyPatch,
    question: GenerationRequest,
    *,
    words: int,
) -> tuple[list[list[BatchItem]], str]:
    """``question``'s answer, sent while a document of ``words`` words is being
    read, and every ``llama_decode`` call's items from the document's first on."""
    calls: list[list[BatchItem]] = []
    reading = threading.Event()
    decode = LlamaBatchModel.decode

    def recording(model: LlamaBatchModel, items: Sequence[BatchItem]) -> None:
        calls.append(list(items))
        reading.set()
        decode(model, items)

    monkeypatch.setattr(LlamaBatchModel, "decode", recording)
    document = asyncio.ensure_future(collect(engine, chat("word " * words, max_tokens=2)))
    assert await asyncio.to_thread(reading.wait, 30.0)  # its first chunk is being read
    beside, _, _ = await collect(engine, question)
    await document
    return calls, beside


async def test_a_step_answers_the_prompts_it_finishes_before_reading_a_chunk_beside_them(
    engine: BatchingLlamaEngine, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A question placed while a long prompt is being read gets its first token
    from a call that reads its own tokens, not the long prompt's chunk beside
    it (a second call reads that), and the answer it gets alone."""
    question = chat("Name a color.", max_tokens=4)
    alone, _, _ = await collect(engine, question)
    calls, beside = await _beside_a_document(engine, monkeypatch, question, words=200)
    assert beside == alone
    doc = calls[0][0].seq
    ends = [i for i, call in enumerate(calls) if any(it.seq != doc and it.logits for it in call)]
    own = calls[ends[0]]  # the call that read the question's last prompt token
    assert all(it.seq != doc for it in own)
    chunk = calls[ends[0] + 1]
    assert chunk
    assert all(it.seq == doc and not it.logits for it in chunk)


async def test_an_answer_that_has_sent_no_text_yet_decodes_before_a_chunk_beside_it(
    engine: BatchingLlamaEngine, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An answer whose first character takes several tokens (this model spells a
    Chinese character in two or three) has sent its client nothing after its
    first token. While a long prompt is read beside it, its next token comes from
    a call of its own right after, not after the long prompt's chunk: under a
    32-stream overload such a question waited two more 0.7-0.8 s steps for its
    first character and reached its client when the long prompt did (2.6 s)."""
    question = chat("推荐几部适合周末看的电影", max_tokens=4)
    alone, _, _ = await collect(engine, question)
    first_event: list[TextDelta] = []
    async for ev in engine.generate(question):
        if isinstance(ev, TextDelta):
            first_event.append(ev)
            break
    assert first_event[0].tokens >= 2  # its first text took more than one token
    calls, beside = await _beside_a_document(engine, monkeypatch, question, words=300)
    assert beside == alone
    doc = calls[0][0].seq
    own = next(i for i, c in enumerate(calls) if any(it.seq != doc and it.logits for it in c))
    q = next(it.seq for it in calls[own] if it.seq != doc and it.logits)
    read_since = [c for c in calls[own + 1 :] if any(it.seq == doc and not it.logits for it in c)]
    assert read_since  # the document was still being read beside it
    # Its second token (no text sent yet) in the very next call, of decoders alone.
    second = calls[own + 1]
    assert any(it.seq == q for it in second)
    assert all(it.logits for it in second)
    assert len({it.seq for it in second}) == len(second)


async def test_limits_stop_and_overflow_under_concurrency(engine: BatchingLlamaEngine) -> None:
    # A prompt with a confident answer ("1, 2, 3, ..."), so that reruns agree.
    prompt = "List the numbers from 1 to 10."
    free, free_fin, _ = await collect(engine, chat(prompt, max_tokens=24))
    assert free_fin.reason == "length"
    stop = ", 6"
    assert stop in free, free

    async def overflow() -> None:
        agen = engine.generate(chat("Hello there.", max_tokens=CTX + 1))
        with pytest.raises(ContextLengthExceeded) as info:
            await agen.__anext__()
        assert info.value.status == 400

    results = await asyncio.gather(
        collect(engine, chat(prompt, max_tokens=5)),
        collect(engine, chat(prompt, max_tokens=24, stop=(stop, "never"))),
        collect(engine, chat("Name a color.", max_tokens=1)),
        overflow(),
    )
    (short, short_fin, _), (stopped, stop_fin, _), (_, one_fin, _), _ = results
    assert (short_fin.reason, short_fin.completion_tokens) == ("length", 5)
    assert free.startswith(short)
    assert stop_fin.reason == "stop"
    assert stopped == free[: free.index(stop)]
    assert stop_fin.completion_tokens < 24
    assert (one_fin.reason, one_fin.completion_tokens) == ("length", 1)
    assert engine.load().running == 0


async def test_disconnect_frees_the_slot_and_its_cache(engine: BatchingLlamaEngine) -> None:
    prompt = "Tell me a long story about a lighthouse keeper."
    # Fill every slot with a long generation, then walk away from one of them.
    streams = [engine.generate(chat(prompt + " " * i, max_tokens=200)) for i in range(SLOTS)]
    for s in streams:
        assert isinstance(await s.__anext__(), TextDelta)
    assert engine.load().running == SLOTS
    before = engine.stats().requests_cancelled
    await streams[0].aclose()
    # The freed slot serves a new request while the others still run. Its own
    # cache was dropped, so the chat template's shared preamble it starts from is
    # a copy of a running slot's.
    copies = engine.stats().prefix_copies
    _, fin, _ = await asyncio.wait_for(collect(engine, chat("Say yes.", max_tokens=2)), 30)
    assert fin.completion_tokens == 2
    assert engine.stats().prefix_copies == copies + 1
    assert 0 < fin.cached_prompt_tokens < fin.prompt_tokens - 2
    assert engine.stats().requests_cancelled == before + 1
    for s in streams[1:]:
        await s.aclose()
    # Cancellations are handled before the next admission, so once this probe is
    # answered nothing else runs. Only the template prefix (kept by the finished
    # "Say yes.") is cached anywhere now; the abandoned prompt's own tokens are not.
    _, probe, _ = await collect(engine, chat("Say no.", max_tokens=1))
    assert engine.load().running == 0
    _, fin, _ = await collect(engine, chat(prompt, max_tokens=1))
    assert 0 < fin.cached_prompt_tokens <= probe.cached_prompt_tokens < fin.prompt_tokens - 8


async def test_finished_prompt_is_reused_as_a_prefix(engine: BatchingLlamaEngine) -> None:
    first_req = chat("What is the tallest mountain on Earth?", max_tokens=6)
    first, fin1, _ = await collect(engine, first_req)
    again, fin2, _ = await collect(engine, first_req)
    assert again == first
    assert fin2.cached_prompt_tokens == fin2.prompt_tokens - 1
    # A longer conversation that starts with the same turn reuses that turn.
    follow = GenerationRequest(
        "t",
        SamplingParams(max_tokens=4, temperature=0.0),
        messages=(
            Message("user", "What is the tallest mountain on Earth?"),
            Message("assistant", first),
            Message("user", "How high is it?"),
        ),
    )
    # What admission charges for the follow-up's prefill: only what no slot holds.
    cold = replace(follow, messages=(Message("user", "What is the deepest lake on Earth?"),
                                     *(follow.messages or ())[1:]))  # fmt: skip
    assert uncached_tokens(engine, follow) == engine.uncached_tokens(follow)
    assert engine.uncached_tokens(follow) < engine.uncached_tokens(cold)
    _, fin3, _ = await collect(engine, follow)
    assert fin3.cached_prompt_tokens >= fin1.prompt_tokens - 2
    assert engine.stats().reused_prompt_tokens > 0


async def test_a_prompt_is_priced_at_what_the_engine_then_prefills(
    engine: BatchingLlamaEngine,
) -> None:
    """Priced on its real tokens, a prompt's chat template and its digits (SmolLM2
    reads each one as a token) count. Guessed from its characters, a quarter of
    the prompts under overload were placed with 20-215 tokens more to prefill
    than priced: a 261-token question priced at 46 took 3.4 s to its first token."""
    figures = " ".join(str(104729 + 7919 * i) for i in range(30))
    request = chat(f"Add up these invoice totals: {figures}", max_tokens=1)
    priced = engine.uncached_tokens(request)
    _, fin, _ = await collect(engine, request)
    taken = fin.prompt_tokens - fin.cached_prompt_tokens
    assert priced is not None
    assert taken > len(figures) / 2  # the digits alone
    # The slot it took may keep a few tokens fewer than the best one holds (a copy
    # is made only when it spares COPY_MIN_TOKENS): within that, the price is exact.
    assert abs(priced - taken) <= COPY_MIN_TOKENS, (priced, taken)
    # In another tenant's scope nothing held counts.
    again = replace(request, cache_salt="another-tenant")
    assert engine.uncached_tokens(request) == 1
    assert engine.uncached_tokens(again) == fin.prompt_tokens


async def test_long_prefill_does_not_stall_running_streams(engine: BatchingLlamaEngine) -> None:
    runner = asyncio.create_task(
        collect(engine, chat("Write a poem about the sea.", max_tokens=60))
    )
    await asyncio.sleep(0.3)  # the runner is decoding
    long_prompt = "Summarize: " + "the quick brown fox jumps over the lazy dog. " * 25
    asked = time.monotonic()
    _, long_fin, long_times = await collect(engine, chat(long_prompt, max_tokens=1))
    _, run_fin, run_times = await runner
    chunks = -(-long_fin.prompt_tokens // CHUNK)
    assert chunks >= 6
    # While the long prompt was prefilled chunk by chunk, the runner kept getting
    # tokens: one per step, not one after the whole prompt.
    during = [t for t in run_times if asked < t < long_times[0]]
    assert len(during) >= chunks - 2, (len(during), chunks)
    assert run_fin.completion_tokens == 60 or run_fin.reason == "stop"


async def test_a_prompt_being_prefilled_is_reported_as_backlog(
    engine: BatchingLlamaEngine,
) -> None:
    """While a long prompt is prefilled chunk by chunk, load() prices what is left of it."""
    await collect(engine, chat("Name a colour." + " Please." * 10, max_tokens=1))  # a rate
    long_prompt = "Summarize: " + "a red fox ran past the old mill by the river. " * 25
    task = asyncio.create_task(collect(engine, chat(long_prompt, max_tokens=1)))
    seen: list[tuple[int, float | None]] = []
    while not task.done():
        backlog = engine.stats().prefill_backlog_tokens
        if backlog:
            seen.append((backlog, engine.load().prefill_backlog_ms))
        await asyncio.sleep(0.005)
    _, fin, _ = await task
    assert seen, "the prefill was never seen in progress"
    first_tokens, first_ms = seen[0]
    assert 4 * CHUNK < first_tokens <= fin.prompt_tokens - fin.cached_prompt_tokens
    assert first_ms is not None
    assert first_ms > 0
    assert [t for t, _ in seen] == sorted((t for t, _ in seen), reverse=True)  # it drains
    assert engine.stats().prefill_backlog_tokens == 0
    assert engine.load().prefill_backlog_ms == 0.0


async def _reading(
    eng: BatchingLlamaEngine, prompt: str, max_tokens: int
) -> asyncio.Task[tuple[str, Finish, list[float]]]:
    """``prompt`` sent, returned once the engine is seen reading it (six chunks left)."""
    task = asyncio.create_task(collect(eng, chat(prompt, max_tokens=max_tokens)))
    while eng.stats().prefill_backlog_tokens < 6 * CHUNK:
        assert not task.done(), "the document's prefill was never seen in progress"
        await asyncio.sleep(0.002)
    return task


async def _short_behind_long(eng: BatchingLlamaEngine) -> tuple[float, float, float, float]:
    """A short question arrives while a long document is being prefilled: the first
    token times of both, and the backlog priced for the short one and for anyone."""
    await collect(eng, chat("Name a colour." + " Please." * 10, max_tokens=1))  # a rate
    # A text no earlier test sent: nothing of it is cached.
    long_prompt = "Outline: " + "the night train to the coast stopped at every village. " * 30
    long_task = await _reading(eng, long_prompt, max_tokens=1)
    ahead_ms = eng.prefill_backlog_ahead_ms(12)
    whole_ms = eng.load().prefill_backlog_ms
    assert ahead_ms is not None
    assert whole_ms is not None
    _, _, short_times = await collect(eng, chat("Name a fruit.", max_tokens=1))
    _, _, long_times = await long_task
    return short_times[0], long_times[0], ahead_ms, whole_ms


async def test_a_short_prompt_is_prefilled_before_a_long_one_admitted_first(
    engine: BatchingLlamaEngine,
) -> None:
    """Shortest first: the question's first token comes while the document is still
    being read, and admission is told it waits behind none of the document."""
    short_first, long_first, ahead_ms, whole_ms = await _short_behind_long(engine)
    assert short_first < long_first - 0.05, long_first - short_first  # steps before
    assert ahead_ms < 0.2 * whole_ms, (ahead_ms, whole_ms)


async def test_a_prompt_being_read_is_priced_as_held_only_as_far_as_it_is_read(
    engine: BatchingLlamaEngine,
) -> None:
    """A newcomer sharing the document a slot is still reading would copy only the
    part read: it is priced near cold, and near warm once the document is read."""
    await collect(engine, chat("Name a colour." + " Please." * 10, max_tokens=1))  # a rate
    doc = "Recap: " + "the harbour master counted every crate that came ashore. " * 25
    follow = GenerationRequest(
        "t",
        SamplingParams(max_tokens=1, temperature=0.0),
        messages=(Message("user", doc), Message("assistant", "ok"), Message("user", "Why?")),
    )
    cold = engine.uncached_tokens(follow)
    task = await _reading(engine, doc, max_tokens=1)
    reading = engine.uncached_tokens(follow)
    await task
    warm = engine.uncached_tokens(follow)
    assert reading > cold / 2, (cold, reading, warm)
    assert warm < cold / 5, (cold, reading, warm)


async def test_the_slots_are_priced_by_what_their_sequences_have_left(
    engine: BatchingLlamaEngine,
) -> None:
    """A slot held by a document being read frees when its prefill and answer are
    done: the engine prices it well above the question beside it (admission's mean
    hold would price both alike). How near the price comes to the wall time depends
    on the machine's load, so that is no unit test's to assert (the arithmetic is
    tests/servekit/test_slot_release.py's): a loaded CI run priced the question at
    417 ms that took 271."""
    await collect(engine, chat("Name a colour." + " Please." * 10, max_tokens=1))  # a rate
    long_prompt = "Continue this log: " + "a lighthouse keeper logged every ship that passed. " * 25
    long_task = await _reading(engine, long_prompt, max_tokens=12)
    short_task = asyncio.create_task(collect(engine, chat("Name a fruit.", max_tokens=2)))
    while engine.stats().running < 2:  # noqa: ASYNC110 (worker's counter)
        await asyncio.sleep(0.002)
    released = engine.slot_release_ms()
    _, long_fin, _ = await long_task
    await short_task
    assert released is not None
    assert len(released) == 2
    short_ms, long_ms = released
    assert long_fin.reason == "length", long_fin  # an early stop: nothing to compare
    assert long_ms > 2 * short_ms, released
    assert engine.slot_release_ms() == ()


async def test_first_come_first_served_holds_the_short_prompt_behind(model_path: Path) -> None:
    """prefill_order: arrival keeps the old order (and prices the whole backlog)."""
    eng = BatchingLlamaEngine(
        BatchingSettings(
            model_path=model_path, model_name="smollm2", slots=SLOTS, ctx_per_slot=CTX,
            chunk_tokens=CHUNK, n_threads=2, prefill_order="arrival",
        )
    )  # fmt: skip
    await eng.start()
    try:
        short_first, long_first, ahead_ms, whole_ms = await _short_behind_long(eng)
    finally:
        await eng.aclose()
    # Not before the document's last chunk: at best in the same step.
    assert short_first > long_first - 0.005, long_first - short_first
    assert ahead_ms == whole_ms


async def test_a_prompt_submitted_mid_step_is_priced_at_its_own_length(
    engine: BatchingLlamaEngine,
) -> None:
    """A job that arrives while the worker is inside a step waits in its inbox
    untokenized; load() prices it from its text, not at the mean of the prompts
    so far (a cold edge admitted two 490-token prompts at once, priced at ~90)."""
    for n in range(4):  # short prompts keep the mean prompt small
        await collect(engine, chat(f"Name a colour, {n}.", max_tokens=1))
    long_a = "Summarize: " + "an old mill stood by the river and ground the wheat. " * 35
    task_a = asyncio.create_task(collect(engine, chat(long_a, max_tokens=1)))
    while engine.stats().prefill_backlog_tokens < 4 * CHUNK:  # noqa: ASYNC110 (worker's counter)
        await asyncio.sleep(0.002)
    a_left = engine.stats().prefill_backlog_tokens
    long_b = "Translate: " + "the ferry left the harbour before dawn with its lights on. " * 33
    stream_b = engine.generate(chat(long_b, max_tokens=1))
    first_b = asyncio.ensure_future(anext(stream_b))
    await asyncio.sleep(0)  # B is submitted; the worker takes it in when its step ends
    report = engine.load()
    _, fin_a, _ = await task_a
    await first_b
    async for _ in stream_b:
        pass
    snap = engine.stats()
    assert report.prefill_backlog_ms is not None
    assert report.prefill_tokens_per_s is not None
    priced = report.prefill_backlog_ms * report.prefill_tokens_per_s / 1000.0
    b_tokens = fin_a.prompt_tokens  # B is about as long as A
    mean = (snap.prompt_tokens - snap.reused_prompt_tokens) / snap.admitted
    assert mean < 0.6 * b_tokens - CHUNK  # what pricing at the mean would have missed
    # A's rest (less a step that may have ended meanwhile) and most of B.
    assert priced >= a_left - CHUNK + 0.6 * b_tokens, (priced, a_left, b_tokens)


def test_a_job_being_tokenized_still_counts_as_pending(model_path: Path) -> None:
    """An idle worker takes a job the moment it is submitted and tokenizes it
    before it has a slot; meanwhile its estimate counts, then its exact tokens,
    never neither (two cold prompts arriving in one instant were both admitted)."""
    stats = BatchingStats(slots=1)
    in_prepare, go_on = threading.Event(), threading.Event()

    def load() -> tuple[LlamaBatchModel, Callable[[GenerationRequest], Prepared]]:
        model = LlamaBatchModel(model_path, n_slots=1, ctx_per_slot=256, n_batch=64, n_threads=2)
        tokens = model.tokenize(b"Summarize: " + b"a red fox ran past the mill. " * 6, True, False)

        def prepare(_: GenerationRequest) -> Prepared:
            in_prepare.set()
            assert go_on.wait(timeout=60)
            return Prepared(tokens, 1)

        return model, prepare

    scheduler = Scheduler(load, chunk_tokens=CHUNK, stats=stats, estimator=PromptEstimator(1))
    scheduler.start().result(timeout=60)
    done = threading.Event()
    counted: list[int] = []

    def emit(event: TextDelta | Finish | BaseException) -> None:
        if not counted:  # the first event: the prompt is prefilled
            counted.append(scheduler.pending_tokens())
        if not isinstance(event, TextDelta):
            done.set()

    try:
        scheduler.submit(Job(chat("ignored"), emit, estimate=70))
        assert in_prepare.wait(timeout=60)
        assert scheduler.pending_tokens() == 70  # taken in, tokenizing, still priced
        assert stats.prefill_backlog_tokens == 0
        go_on.set()
        assert done.wait(timeout=60)
    finally:
        go_on.set()
        scheduler.stop()
    assert counted == [0]  # once in a slot, only the backlog counts it
    assert scheduler.pending_tokens() == 0


def test_a_finished_prompt_is_gone_from_the_backlog_before_its_client_hears(
    model_path: Path,
) -> None:
    """At the moment the worker emits a request's last event, the stats hold no
    backlog for it: a client (or the admission check behind it) reading load
    after its answer ended must not see its prompt as still to prefill."""
    stats = BatchingStats(slots=1)

    def load() -> tuple[LlamaBatchModel, Callable[[GenerationRequest], Prepared]]:
        model = LlamaBatchModel(model_path, n_slots=1, ctx_per_slot=256, n_batch=64, n_threads=2)
        tokens = model.tokenize(b"Summarize: " + b"a red fox ran past the mill. " * 6, True, False)
        return model, lambda _: Prepared(tokens, 1)

    scheduler = Scheduler(load, chunk_tokens=CHUNK, stats=stats, estimator=PromptEstimator(1))
    scheduler.start().result(timeout=60)
    at_finish: list[int] = []
    done = threading.Event()

    def emit(event: TextDelta | Finish | BaseException) -> None:
        if not isinstance(event, TextDelta):  # the last event, on the worker thread
            at_finish.append(stats.prefill_backlog_tokens)
            done.set()

    try:
        scheduler.submit(Job(chat("ignored"), emit))
        assert done.wait(timeout=60)
    finally:
        scheduler.stop()
    assert stats.prefill_tokens > CHUNK  # the prompt took more than one step
    assert at_finish == [0]


async def test_load_report_and_stats(engine: BatchingLlamaEngine) -> None:
    await asyncio.gather(*(collect(engine, chat(f"Count to {n}.", max_tokens=4)) for n in (3, 4)))
    report = engine.load()
    assert report.ready
    assert report.capacity == SLOTS
    assert report.running == 0
    assert report.waiting == 0
    assert report.ttft_p50_ms is not None
    assert report.decode_tokens_per_s is not None
    snap = engine.stats()
    assert snap.slots == SLOTS
    assert snap.steps > 0
    assert snap.mean_batch_sequences >= 1.0
    # Two streams at once were decoded in one batch at least once.
    assert snap.batch_size_counts[-1] - snap.batch_size_counts[0] > 0
    # The same figures as Prometheus series.
    registry = CollectorRegistry()
    registry.register(BatchingCollector(engine.stats, {"model": "smollm2"}))
    text = generate_latest(registry).decode()
    assert f'servekit:batch_slots{{model="smollm2"}} {float(SLOTS)}' in text
    assert 'servekit:batch_size_sequences_bucket{le="1",model="smollm2"}' in text
    labels = {"model": "smollm2"}
    steps = registry.get_sample_value("servekit:batch_size_sequences_count", labels)
    assert steps is not None
    assert steps >= snap.steps


async def test_busy_slowdown_is_measured_apart_from_prompt_length(model_path: Path) -> None:
    # Idle, prompts of 4 and 60 words: TTFTs hundreds of ms apart (the old
    # penalty's P95 - P50). Then the same while one sequence decodes: what it
    # adds per running sequence is a small part of that spread.
    eng = BatchingLlamaEngine(
        BatchingSettings(model_path=model_path, model_name="smollm2", slots=2, ctx_per_slot=1024)
    )
    await eng.start()

    def probe(i: int) -> GenerationRequest:
        return chat(" ".join(f"word{i}x{j}" for j in range(4 if i % 2 else 60)), max_tokens=1)

    try:
        for i in range(6):
            await collect(eng, probe(i))
        idle = eng.load()
        assert idle.busy_ms_per_seq is None  # nothing running at any admission yet
        assert idle.ttft_p95_ms is not None
        assert idle.ttft_p50_ms is not None
        spread = idle.ttft_p95_ms - idle.ttft_p50_ms
        decoding = asyncio.create_task(collect(eng, chat("Count from 1 to 200.", max_tokens=400)))
        for i in range(6, 16):
            while eng.load().running < 1:  # noqa: ASYNC110 (a counter of the worker thread)
                await asyncio.sleep(0.01)
            await collect(eng, probe(i))
        busy = eng.load().busy_ms_per_seq
        registry = CollectorRegistry()
        registry.register(BatchingCollector(eng.stats, {"model": "smollm2"}))
        gauge = registry.get_sample_value(
            "servekit:batch_busy_seconds_per_sequence", {"model": "smollm2"}
        )
        decoding.cancel()
        await asyncio.gather(decoding, return_exceptions=True)
    finally:
        await eng.aclose()
    assert busy is not None
    assert 0 <= busy < spread / 3, (busy, spread)
    assert gauge == pytest.approx(busy / 1000)  # the same figure as a Prometheus gauge


async def test_load_reports_the_held_prompts_as_block_names_a_router_reads(
    engine: BatchingLlamaEngine,
) -> None:
    system = "You answer questions about the Harbour Street library. " * 14  # ~780 chars
    messages = (Message("system", system), Message("user", "When do you open on Sundays?"))
    request = GenerationRequest("t", SamplingParams(max_tokens=2, temperature=0.0), messages)
    await collect(engine, request)
    report = engine.load()
    assert report.prefix_block_chars == 64
    assert report.prefix_blocks
    index = PrefixIndex(block_chars=64)
    turns = [Turn(m.role, m.content) for m in messages]
    asked = index.prefix(turns, 200)
    found = index.cached_blocks("edge", asked, report)
    assert found.source == "reported"
    assert found.blocks >= len(asked.blocks) - 3  # to within the report's stride
    # Another question after the same system prompt: the system prompt's blocks
    other = index.prefix([turns[0], Turn("user", "Can I renew a book by phone?")], 200)
    assert len(system) // 64 - 4 <= index.cached_blocks("edge", other, report).blocks
    # A conversation no slot holds is credited nothing.
    stranger = index.prefix([Turn("user", "Translate 'good night' into French. " * 5)], 60)
    assert index.cached_blocks("edge", stranger, report).blocks == 0


async def test_a_next_turn_finds_the_answer_held_and_reported(
    engine: BatchingLlamaEngine,
) -> None:
    """The slot keeps the answer's tokens beside the prompt's: a next turn, which sends
    the answer back as history, is priced at its new message alone, and the load
    report names the answer's blocks as a router names that history."""
    opening = (Message("user", "Describe a lighthouse keeper's morning in detail."),)
    first = GenerationRequest("t", SamplingParams(max_tokens=48, temperature=0.0), opening)
    answer, fin1, _ = await collect(engine, first)
    assert len(answer) > 128  # two of the report's blocks at least
    messages = (*opening, Message("assistant", answer), Message("user", "And at night?"))
    follow = GenerationRequest("t", SamplingParams(max_tokens=1, temperature=0.0), messages)
    priced, report = engine.uncached_tokens(follow), engine.load()
    index = PrefixIndex(block_chars=64)
    history = index.prefix([Turn(m.role, m.content) for m in messages], 100)
    answered = index.prefix([Turn(m.role, m.content) for m in messages[:2]], 100)
    assert index.cached_blocks("edge", history, report).blocks >= len(answered.blocks) - 3
    _, fin2, _ = await collect(engine, follow)
    taken = fin2.prompt_tokens - fin2.cached_prompt_tokens
    assert fin2.cached_prompt_tokens > fin1.prompt_tokens  # the engine did reuse the answer
    assert priced <= taken + 8, (priced, taken)  # not the whole answer again
