"""Both llama.cpp engines on the real model reuse a cached prompt only within its cache
scope (the request's ``cache_salt``): another tenant's long prompt, sent again word for
word, is prefilled from scratch, reported as ``cached_prompt_tokens`` 0 and earns no
placement credit from the engine's load report."""

from __future__ import annotations

import dataclasses
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from geo_router.conversation import Turn
from geo_router.prefix_index import PrefixIndex
from servekit.engine.batching import BatchingLlamaEngine, BatchingSettings
from servekit.engine.llama import LlamaCppEngine, LlamaSettings
from servekit.engine.protocol import Engine, Finish, GenerationRequest, Message, SamplingParams

pytestmark = [pytest.mark.model, pytest.mark.anyio]

ACME, EVIL = "a" * 64, "e" * 64
SYSTEM = "You answer questions about the Harbour Street library, briefly. " * 8  # ~500 chars


def ask(salt: str | None, question: str = "When do you open on Sundays?") -> GenerationRequest:
    messages = (Message("system", SYSTEM), Message("user", question))
    params = SamplingParams(max_tokens=2, temperature=0.0)
    return GenerationRequest("t", params, messages, cache_salt=salt)


async def finish(engine: Engine, request: GenerationRequest) -> Finish:
    events = [e async for e in engine.generate(request)]
    last = events[-1]
    assert isinstance(last, Finish)
    return last


@pytest.fixture(scope="module")
async def batching(model_path: Path) -> AsyncIterator[BatchingLlamaEngine]:
    settings = BatchingSettings(
        model_path=model_path, model_name="smol", slots=2, ctx_per_slot=512, chunk_tokens=64
    )
    eng = BatchingLlamaEngine(settings)
    await eng.start()
    yield eng
    await eng.aclose()


async def test_batching_slots_serve_only_their_own_scope(batching: BatchingLlamaEngine) -> None:
    first = await finish(batching, ask(ACME))
    assert first.prompt_tokens > 100
    probe = await finish(batching, ask(EVIL))  # the same text, another tenant
    assert probe.cached_prompt_tokens == 0
    copies = batching.stats().prefix_copies
    again = await finish(batching, ask(ACME, "Can I renew a book by phone?"))
    assert again.cached_prompt_tokens > 80  # its own scope still hits
    # The other scope neither copies a slot's cache nor reuses one it shares a slot with.
    probe = await finish(batching, ask(EVIL, "Can I renew a book by phone?"))
    assert probe.cached_prompt_tokens > 80  # its own earlier prompt, in its own slot
    assert batching.stats().prefix_copies == copies


async def test_the_load_report_names_held_prompts_per_scope(batching: BatchingLlamaEngine) -> None:
    await finish(batching, ask(ACME, "Is there parking nearby?"))
    report = batching.load()
    index = PrefixIndex(block_chars=64)
    turns = [Turn("system", SYSTEM), Turn("user", "Is there parking nearby?")]
    held = index.cached_blocks("e", index.prefix(turns, 150, cache_salt=ACME), report).blocks
    assert held >= len(SYSTEM) // 64 - 4
    for salt in ("x" * 64, None):  # another tenant (evil's slot: the test above), no scope
        stranger = index.prefix(turns, 150, cache_salt=salt)
        assert index.cached_blocks("e", stranger, report).blocks == 0


async def test_the_single_sequence_engine_resets_another_scopes_context(
    model_path: Path,
) -> None:
    eng = LlamaCppEngine(
        LlamaSettings(model_path=model_path, model_name="smol", n_ctx=512, n_threads=2)
    )
    await eng.start()
    try:
        await finish(eng, ask(ACME))
        probe = await finish(eng, ask(EVIL))  # the live context holds acme's prompt
        assert probe.cached_prompt_tokens == 0
        # acme's own prompt: from the saved states (evil's is live now), in its scope only.
        again = await finish(eng, dataclasses.replace(ask(ACME), request_id="again"))
        assert again.cached_prompt_tokens > 80
        shared = await finish(eng, ask(ACME, "Are dogs allowed inside?"))
        assert shared.cached_prompt_tokens > 80
        stranger = await finish(eng, ask("x" * 64, "Are dogs allowed inside?"))
        assert stranger.cached_prompt_tokens == 0
    finally:
        await eng.aclose()
