"""A vLLM engine's held prefixes: session-tagged block events walked into the routers'
block names, eviction and reset taking them away."""

from __future__ import annotations

import pytest

from servekit.engine.held_prefixes import HeldPrefixes
from servekit.engine.kv_events import AllBlocksCleared, BlockRemoved, BlockStored
from servekit.engine.prompt_estimate import request_blocks
from servekit.engine.protocol import GenerationRequest, Message, SamplingParams
from servekit.prefix_blocks import leading_run

SYSTEM = "You answer questions about the Harbour Street library, briefly. " * 16  # 1024 chars


def ask(question: str = "When do you open?", salt: str | None = None) -> GenerationRequest:
    messages = (Message("system", SYSTEM), Message("user", question))
    return GenerationRequest("r", SamplingParams(max_tokens=2), messages, cache_salt=salt)


def blocks(first: int, n: int) -> list[bytes]:
    return [i.to_bytes(32, "big") for i in range(first, first + n)]


def stored(session: str, hashes: list[bytes], parent: bytes | None = None) -> BlockStored:
    return BlockStored(
        block_hashes=hashes,
        parent_block_hash=parent,
        token_ids=[0] * (16 * len(hashes)),
        block_size=16,
        medium="GPU",
        session_id=session,
    )


def session(request: GenerationRequest) -> str:
    value = request.extra["session_id"]
    assert isinstance(value, str)
    return value


def test_tag_asks_vllm_to_report_reused_blocks_too() -> None:
    held = HeldPrefixes()
    sent = held.tag(ask())
    assert sent.extra["vllm_xargs"] == {"kv_cache_report_mode": "full"}
    assert session(sent) != session(held.tag(ask()))
    raw = GenerationRequest("c", SamplingParams(), prompt=SYSTEM)  # no conversation: no names
    assert held.tag(raw) is raw


def test_held_tokens_become_a_leading_share_of_the_names() -> None:
    held = HeldPrefixes(block_chars=64, stride=1)
    request = held.tag(ask())
    names = request_blocks(request, 64)
    assert held.held_blocks() == ()  # sent, nothing stored yet
    # the prompt came to 256 tokens; 8 blocks of 16 tokens are stored: half of it
    held.apply([stored(session(request), blocks(0, 8))])
    held.finished(request, 256)
    report = held.held_blocks()
    assert leading_run(names, set(report)) == len(names) // 2
    # more blocks of the same session chain on; beyond the prompt (output) is capped
    held.apply([stored(session(request), blocks(8, 12), parent=blocks(7, 1)[0])])
    assert leading_run(names, set(held.held_blocks())) == len(names)


def test_eviction_of_an_inner_block_ends_the_run() -> None:
    held = HeldPrefixes(block_chars=64, stride=4)
    request = held.tag(ask())
    names = request_blocks(request, 64)
    held.apply([stored(session(request), blocks(0, 16))])
    held.finished(request, 256)
    assert leading_run(names, set(held.held_blocks())) == len(names)
    held.apply([BlockRemoved(block_hashes=blocks(4, 1), medium="GPU")])  # blocks 0..3 remain
    run = leading_run(names, set(held.held_blocks()))
    assert 0 < run <= len(names) // 4
    held.apply([AllBlocksCleared()])
    assert held.held_blocks() == ()


def test_a_reused_prefix_links_through_stored_parents() -> None:
    """Without a full-mode reuse event, a session's first new block names its parent:
    the chain before it is walked from the blocks other sessions stored."""
    held = HeldPrefixes(block_chars=64, stride=1)
    first = held.tag(ask())
    held.apply([stored(session(first), blocks(0, 12))])
    held.finished(first, 256)
    second = held.tag(ask("Can I renew a book by phone?"))
    held.apply([stored(session(second), blocks(100, 4), parent=blocks(11, 1)[0])])
    held.finished(second, 256)
    names = request_blocks(second, 64)
    assert leading_run(names, set(held.held_blocks())) == len(names)
    held.apply([BlockRemoved(block_hashes=blocks(100, 1), medium="GPU")])
    assert leading_run(names, set(held.held_blocks())) == len(names) * 12 // 16


def test_reset_forgets_everything_held() -> None:
    held = HeldPrefixes()
    request = held.tag(ask())
    held.apply([stored(session(request), blocks(0, 16))])
    assert held.held_blocks()  # before finish: at the default characters per token
    held.reset()
    assert held.held_blocks() == ()


def test_names_are_per_cache_scope() -> None:
    held = HeldPrefixes(block_chars=64, stride=1)
    request = held.tag(ask(salt="acme"))
    held.apply([stored(session(request), blocks(0, 16))])
    held.finished(request, 256)
    report = set(held.held_blocks())
    assert leading_run(request_blocks(ask(salt="acme"), 64), report) > 0
    assert leading_run(request_blocks(ask(), 64), report) == 0


@pytest.mark.parametrize(
    "event",
    [
        BlockStored(block_hashes=blocks(0, 16), medium="CPU", session_id="x"),
        BlockStored(block_hashes=blocks(0, 16), medium="GPU", group_idx=1, session_id="x"),
    ],
)
def test_other_media_and_groups_are_not_the_engines_cache(event: BlockStored) -> None:
    held = HeldPrefixes()
    request = held.tag(ask())
    held.apply([BlockStored(**{**_fields(event), "session_id": session(request)})])
    assert held.held_blocks() == ()


def _fields(event: BlockStored) -> dict[str, object]:
    return {f: getattr(event, f) for f in event.__struct_fields__}


def test_bounded() -> None:
    held = HeldPrefixes(block_chars=64, stride=1, max_prompts=2, max_blocks=8)
    requests = [held.tag(ask(f"Question {i}?")) for i in range(3)]
    assert len(held._prompts) == 2  # the oldest forgotten
    held.apply([stored(session(requests[2]), blocks(0, 16))])
    assert len(held._stored) == 8  # the oldest blocks forgotten: read as evicted
    assert held.held_blocks() == ()
