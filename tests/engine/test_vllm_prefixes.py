"""A vLLM server's prefix report: when a server gives one, its launch flags, and an
engine whose requests go through it."""

from __future__ import annotations

import json

import pytest

from hybrid_llm.local.scripted_engine import ScriptedEngine
from servekit.engine.kv_events import BlockStored
from servekit.engine.protocol import Finish, GenerationRequest, Message, SamplingParams
from servekit.engine.vllm import VllmEngineSettings, vllm_command
from servekit.engine.vllm_prefixes import PrefixReportingEngine, prefix_report_for

SYSTEM = "You answer questions about the Harbour Street library, briefly. " * 16


def settings(**over: object) -> VllmEngineSettings:
    return VllmEngineSettings.model_validate({"model": "m", "model_name": "m", **over})


def test_a_server_reports_unless_prefix_caching_or_the_report_is_off() -> None:
    assert prefix_report_for(settings(enable_prefix_caching=False), "x") is None
    assert prefix_report_for(settings(prefix_report_block_chars=0), "x") is None
    report = prefix_report_for(settings(prefix_report_block_chars=128), "x")
    assert report is not None
    assert report.held.block_chars == 128
    argv = vllm_command(settings(), 9000, kv_events=report.argv).argv
    config = json.loads(argv[argv.index("--kv-events-config") + 1])
    assert config == {
        "enable_kv_cache_events": True,
        "publisher": "zmq",
        "endpoint": f"ipc://{report.socket}",
        "topic": "kv",
    }
    assert "--kv-events-config" not in vllm_command(settings(), 9000).argv


@pytest.mark.anyio
async def test_requests_go_through_the_report_and_load_carries_it() -> None:
    report = prefix_report_for(settings(), "t")
    assert report is not None
    inner = ScriptedEngine("m")
    engine = PrefixReportingEngine(inner, report)
    await engine.start()
    request = GenerationRequest(
        "r", SamplingParams(max_tokens=2), (Message("system", SYSTEM), Message("user", "Hi?"))
    )
    events = [e async for e in engine.generate(request)]
    assert isinstance(events[-1], Finish)
    sent = inner.requests[-1]
    session = sent.extra["session_id"]
    assert sent.extra["vllm_xargs"] == {"kv_cache_report_mode": "full"}
    assert engine.load().prefix_blocks == ()  # nothing stored yet
    # The scripted engine counts a word a token: 16 blocks of 16 hold them all.
    stored = BlockStored(block_hashes=[bytes([i]) * 32 for i in range(16)], token_ids=[0] * 256,
                         block_size=16, session_id=session)  # fmt: skip
    report.held.apply([stored])
    load = engine.load()
    assert load.prefix_blocks
    assert load.prefix_block_chars == 64
    assert load.model == "m"  # the rest is the inner engine's
    await engine.aclose()
    await report.aclose()
