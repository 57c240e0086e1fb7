"""vLLM's KV-cache event batches, decoded from bytes vLLM's own encoder made, and
received over a real ZeroMQ socket."""

from __future__ import annotations

import asyncio
import subprocess
from pathlib import Path

import pytest
import zmq
import zmq.asyncio

from servekit.engine.kv_events import (
    AllBlocksCleared,
    BlockRemoved,
    BlockStored,
    KvEvent,
    KvEventFeed,
    decode_batch,
    kv_events_argv,
)
from tests.support.vllm import VLLM

H1, H2, H3 = b"\x01" * 32, b"\x02" * 32, b"\x03" * 32

# Built and encoded exactly as vLLM's scheduler publishes it (ZmqEventPublisher:
# msgspec.msgpack.Encoder().encode(KVEventBatch)), every field vLLM 0.32 sets.
_ENCODE = """
import sys, msgspec
from vllm.distributed.kv_events import (
    AllBlocksCleared, BlockRemoved, BlockStored, KVEventBatch)
h1, h2, h3 = b"\\x01" * 32, b"\\x02" * 32, b"\\x03" * 32
batch = KVEventBatch(ts=1.5, events=[
    BlockStored(block_hashes=[h1, h2], parent_block_hash=None, token_ids=list(range(32)),
                block_size=16, lora_id=None, medium="GPU", lora_name=None,
                extra_keys=[("tenant-salt",), None], group_idx=0,
                kv_cache_spec_kind="full_attention", session_id="hp-0"),
    BlockStored(block_hashes=[h3], parent_block_hash=h2, token_ids=list(range(16)),
                block_size=16, lora_id=None, medium="GPU", lora_name=None),
    BlockRemoved(block_hashes=[h3], medium="GPU", group_idx=0),
    AllBlocksCleared(),
], data_parallel_rank=0)
sys.stdout.write(msgspec.msgpack.Encoder().encode(batch).hex())
"""


@pytest.fixture(scope="module")
def vllm_payload() -> bytes:
    python = VLLM.parent / "python"
    if not python.exists():
        pytest.skip(f"no vLLM environment ({python}): run scripts/setup.sh --dev")
    out = subprocess.run(
        [str(python), "-c", _ENCODE], capture_output=True, text=True, check=True, timeout=120
    )
    return bytes.fromhex(out.stdout)


def test_decodes_what_vllm_encodes(vllm_payload: bytes) -> None:
    events = decode_batch(vllm_payload)
    assert events == [
        BlockStored(
            block_hashes=[H1, H2],
            parent_block_hash=None,
            token_ids=list(range(32)),
            block_size=16,
            medium="GPU",
            group_idx=0,
            session_id="hp-0",
        ),
        BlockStored(
            block_hashes=[H3],
            parent_block_hash=H2,
            token_ids=list(range(16)),
            block_size=16,
            medium="GPU",
        ),
        BlockRemoved(block_hashes=[H3], medium="GPU", group_idx=0),
        AllBlocksCleared(),
    ]
    first = events[0]
    assert isinstance(first, BlockStored)
    assert first.tokens_per_block == 16


def test_int_block_hashes_and_unknown_event_types() -> None:
    """VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES publishes ints; a newer vLLM's new event
    type is skipped, not the whole batch."""
    import msgspec

    class Novel(msgspec.Struct, tag=True):
        what: str

    class Batch(msgspec.Struct, array_like=True):
        ts: float
        events: list[BlockStored | Novel]

    payload = msgspec.msgpack.encode(
        Batch(1.0, [Novel("x"), BlockStored(block_hashes=[7], token_ids=[1, 2])])
    )
    assert decode_batch(payload) == [BlockStored(block_hashes=[7], token_ids=[1, 2])]
    with pytest.raises(msgspec.DecodeError):
        decode_batch(b"\x01not a batch")


def test_launch_flag_names_the_endpoint() -> None:
    flag, config = kv_events_argv("ipc:///run/x.sock")
    assert flag == "--kv-events-config"
    assert '"endpoint":"ipc:///run/x.sock"' in config
    assert '"enable_kv_cache_events":true' in config


def test_a_sequence_gap_resets_before_the_next_batch(vllm_payload: bytes) -> None:
    log: list[str] = []
    feed = KvEventFeed(
        "ipc://x", lambda ev: log.append(f"batch{len(ev)}"), lambda: log.append("gap")
    )
    feed.receive(5, vllm_payload)  # the first one seen: any number
    feed.receive(6, vllm_payload)
    feed.receive(9, vllm_payload)  # 7 and 8 were dropped
    feed.receive(0, vllm_payload)  # the engine restarted
    feed.receive(1, b"garbage")
    assert log == ["batch4", "batch4", "gap", "batch4", "gap", "batch4", "gap"]
    assert (feed.batches, feed.gaps, feed.undecodable) == (4, 2, 1)


@pytest.mark.anyio
async def test_feed_receives_over_zeromq(tmp_path: Path, vllm_payload: bytes) -> None:
    endpoint = f"ipc://{tmp_path}/events"
    got: list[list[KvEvent]] = []
    arrived = asyncio.Event()

    def sink(events: list[KvEvent]) -> None:
        got.append(events)
        arrived.set()

    feed = KvEventFeed(endpoint, sink, lambda: None)
    task = feed.start()  # connects before the publisher binds, as with a starting engine
    context = zmq.asyncio.Context()
    pub = context.socket(zmq.PUB)
    pub.bind(endpoint)
    try:
        for seq in range(200):  # a PUB drops what it sends before the subscription lands
            await pub.send_multipart([b"kv", seq.to_bytes(8, "big"), vllm_payload])
            if arrived.is_set():
                break
            await asyncio.sleep(0.02)
        assert got
        assert got[0] == decode_batch(vllm_payload)
        assert feed.gaps == 0
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        pub.close(linger=0)
        context.term()
