"""The in-process llama.cpp engine on the real model."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from servekit.engine.llama import LlamaCppEngine, LlamaSettings
from servekit.engine.protocol import (
    Finish,
    GenerationEvent,
    GenerationRequest,
    Message,
    SamplingParams,
    TextDelta,
)
from servekit.errors import ContextLengthExceeded, NotReady

pytestmark = [pytest.mark.anyio, pytest.mark.model]


@pytest.fixture(scope="module")
async def engine(model_path: Path) -> AsyncIterator[LlamaCppEngine]:
    eng = LlamaCppEngine(
        LlamaSettings(model_path=model_path, model_name="smol", n_ctx=512, n_threads=2),
        version="v1",
    )
    await eng.start()
    yield eng
    await eng.aclose()


def chat(text: str, **sampling: object) -> GenerationRequest:
    params = {"max_tokens": 12, "temperature": 0.0, **sampling}
    return GenerationRequest("t", SamplingParams(**params), messages=(Message("user", text),))  # type: ignore[arg-type]


async def run(engine: LlamaCppEngine, req: GenerationRequest) -> tuple[str, Finish]:
    events: list[GenerationEvent] = [e async for e in engine.generate(req)]
    finish = events[-1]
    assert isinstance(finish, Finish)
    assert all(isinstance(e, TextDelta) for e in events[:-1])
    return "".join(e.text for e in events if isinstance(e, TextDelta)), finish


async def test_greedy_is_deterministic_and_accounts_tokens(engine: LlamaCppEngine) -> None:
    text1, fin1 = await run(engine, chat("Name three colors."))
    text2, fin2 = await run(engine, chat("Name three colors."))
    assert text1 == text2
    assert text1.strip()
    assert fin1.completion_tokens == fin2.completion_tokens <= 12
    assert fin1.prompt_tokens > 10
    if fin1.reason == "length":
        assert fin1.completion_tokens == 12


async def test_max_tokens_limits_output(engine: LlamaCppEngine) -> None:
    _, fin = await run(engine, chat("Write a long story about a dragon.", max_tokens=3))
    assert fin.reason == "length"
    assert fin.completion_tokens == 3


async def test_stop_sequence_is_honoured_and_excluded(engine: LlamaCppEngine) -> None:
    full, _ = await run(engine, chat("Count from 1 to 10, separated by commas.", max_tokens=30))
    assert "," in full
    stop = full[full.index(",") :][:2] if len(full) > full.index(",") + 1 else ","
    text, fin = await run(
        engine, chat("Count from 1 to 10, separated by commas.", max_tokens=30, stop=(stop,))
    )
    assert fin.reason == "stop"
    assert stop not in text
    assert full.startswith(text)


async def test_prompt_longer_than_context_is_rejected_before_any_event(
    engine: LlamaCppEngine,
) -> None:
    with pytest.raises(ContextLengthExceeded) as info:
        await run(engine, chat("word " * 600))
    assert info.value.param == "messages"
    with pytest.raises(ContextLengthExceeded) as info:
        await run(engine, chat("hi", max_tokens=600))
    assert info.value.param == "max_tokens"


async def test_max_tokens_past_the_remaining_window_is_clamped(engine: LlamaCppEngine) -> None:
    req = GenerationRequest(
        "w", SamplingParams(max_tokens=100, temperature=0.0), prompt="one " * 500
    )
    _, fin = await run(engine, req)
    assert fin.prompt_tokens + fin.completion_tokens <= 512
    assert fin.completion_tokens == 512 - fin.prompt_tokens or fin.reason == "stop"
    if fin.completion_tokens == 512 - fin.prompt_tokens:
        assert fin.reason == "length"


async def test_closing_the_stream_frees_the_engine_within_a_token(engine: LlamaCppEngine) -> None:
    events = engine.generate(chat("Tell me a very long story.", max_tokens=400))
    got = 0
    async for event in events:
        if isinstance(event, TextDelta):
            got += 1
            if got == 3:
                break
    await events.aclose()  # type: ignore[attr-defined]
    # A new request is served promptly: the worker stopped the cancelled one.
    _text, fin = await asyncio.wait_for(run(engine, chat("Say yes.", max_tokens=2)), timeout=20)
    assert fin.completion_tokens <= 2
    await asyncio.sleep(0.05)
    assert engine.load().running == 0


async def test_repeated_long_prefix_hits_the_cache(engine: LlamaCppEngine) -> None:
    system = "You are a careful assistant. " * 20
    first = GenerationRequest(
        "a", SamplingParams(max_tokens=2, temperature=0.0),
        messages=(Message("system", system), Message("user", "Question one?")),
    )  # fmt: skip
    other = chat("Something unrelated entirely.", max_tokens=2)
    second = GenerationRequest(
        "b", SamplingParams(max_tokens=2, temperature=0.0),
        messages=(Message("system", system), Message("user", "Question two?")),
    )  # fmt: skip
    _, f1 = await run(engine, first)
    await run(engine, other)  # evicts the live context; only the state cache can help
    _, f2 = await run(engine, second)
    assert f2.cached_prompt_tokens > 100
    assert f2.cached_prompt_tokens > f1.cached_prompt_tokens
    report = engine.load()
    assert report.prefix_cache_hit_tokens >= f2.cached_prompt_tokens


async def test_a_prompt_stopped_at_its_first_token_is_still_cached(
    engine: LlamaCppEngine,
) -> None:
    system = "You answer in one word, always. " * 16
    first = GenerationRequest(
        "a", SamplingParams(max_tokens=1, temperature=0.0),
        messages=(Message("system", system), Message("user", "Colour of snow?")),
    )  # fmt: skip
    second = GenerationRequest(
        "b", SamplingParams(max_tokens=4, temperature=0.0),
        messages=(Message("system", system), Message("user", "Colour of grass?")),
    )  # fmt: skip
    _, f1 = await run(engine, first)
    assert f1.completion_tokens == 1
    await run(engine, chat("Something unrelated entirely.", max_tokens=2))
    _, f2 = await run(engine, second)
    assert f2.cached_prompt_tokens > 100


async def test_continue_final_message_continues_the_turn(engine: LlamaCppEngine) -> None:
    full, _ = await run(engine, chat("Name three colors.", max_tokens=10))
    head = full[: len(full) // 2]
    cont = GenerationRequest(
        "c",
        SamplingParams(max_tokens=10, temperature=0.0),
        messages=(Message("user", "Name three colors."), Message("assistant", head)),
        continue_final_message=True,
    )
    tail, _ = await run(engine, cont)
    # Greedy continuation from a token-aligned prefix reproduces the rest.
    assert (head + tail).startswith(full[: len(head) + 3])


async def test_not_ready_before_start(model_path: Path) -> None:
    eng = LlamaCppEngine(LlamaSettings(model_path=model_path, model_name="x", n_ctx=128))
    assert not await eng.ready()
    with pytest.raises(NotReady):
        await run(eng, chat("hi"))
    await eng.aclose()


async def test_prompt_lookup_speculation_matches_plain_greedy_and_counts(model_path: Path) -> None:
    spec = LlamaCppEngine(
        LlamaSettings(
            model_path=model_path, model_name="s", n_ctx=256, n_threads=2,
            prompt_lookup={"enabled": True, "num_pred_tokens": 4},  # type: ignore[arg-type]
        )
    )  # fmt: skip
    plain = LlamaCppEngine(
        LlamaSettings(model_path=model_path, model_name="p", n_ctx=256, n_threads=2)
    )
    req = GenerationRequest(
        "s", SamplingParams(max_tokens=24, temperature=0.0), prompt="1, 2, 3, 4, 5, 6,"
    )
    try:
        await spec.start()
        await plain.start()
        spec_text, _ = await run(spec, req)
        plain_text, _ = await run(plain, req)
        assert spec_text == plain_text
        report = spec.load()
        assert report.spec_draft_tokens > 0
        assert 0 < report.spec_accepted_tokens <= report.spec_draft_tokens
    finally:
        await spec.aclose()
        await plain.aclose()
