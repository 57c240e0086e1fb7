"""vLLM's KV-cache events: the launch flag, the wire format and a subscriber.

Started with ``--kv-events-config`` (:func:`kv_events_argv`), ``vllm serve``
publishes what its prefix cache stores and evicts over ZeroMQ
(``vllm/distributed/kv_events.py``, ``ZmqEventPublisher``): each engine step's
events as one multipart message ``(topic, seq, payload)``, ``seq`` an 8-byte
big-endian counter from 0 and ``payload`` a msgpack ``KVEventBatch``. The
batch is an array ``[ts, events, data_parallel_rank]``; each event a map
tagged by ``"type"``:

- ``BlockStored``: ``block_hashes`` (chained: each names its whole prefix;
  32-byte sha256 digests, or ints with ``VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES``),
  ``parent_block_hash`` (the block before the first, None at the start of a
  prompt), ``token_ids`` of all the blocks, ``block_size``, ``medium``,
  ``group_idx`` and ``session_id`` (the request's ``session_id`` body field);
- ``BlockRemoved``: ``block_hashes`` evicted;
- ``AllBlocksCleared``: the prefix cache was reset.

The structs below mirror vLLM's fields that are read here; unknown fields are
ignored and an event of an unknown type is skipped, so a newer vLLM's
additions do not stop the feed. :class:`KvEventFeed` subscribes from the
service's event loop (a task of its own, never on a request's path) and hands
each decoded batch to a sink; a gap in ``seq`` (the subscriber fell behind
ZeroMQ's high-water mark, or the engine restarted and counts from 0 again)
is reported, since what the sink holds may then be stale.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections.abc import Callable

import msgspec
import zmq
import zmq.asyncio

__all__ = [
    "AllBlocksCleared",
    "BlockHash",
    "BlockRemoved",
    "BlockStored",
    "KvEvent",
    "KvEventFeed",
    "decode_batch",
    "kv_events_argv",
]

log = logging.getLogger(__name__)

BlockHash = bytes | int
# Messages the subscriber's socket queues before ZeroMQ drops (a gap then resets the sink).
_RECEIVE_HWM = 10_000


class BlockStored(msgspec.Struct, tag=True, omit_defaults=True):
    block_hashes: list[BlockHash]
    parent_block_hash: BlockHash | None = None
    token_ids: list[int] = msgspec.field(default_factory=list)
    block_size: int = 0
    medium: str | None = None
    group_idx: int | None = None
    session_id: str | None = None

    @property
    def tokens_per_block(self) -> int:
        n = len(self.block_hashes)
        return len(self.token_ids) // n if n else self.block_size


class BlockRemoved(msgspec.Struct, tag=True, omit_defaults=True):
    block_hashes: list[BlockHash]
    medium: str | None = None
    group_idx: int | None = None


class AllBlocksCleared(msgspec.Struct, tag=True, omit_defaults=True):
    pass


KvEvent = BlockStored | BlockRemoved | AllBlocksCleared


class _Batch(msgspec.Struct, array_like=True):
    ts: float
    events: list[msgspec.Raw]
    data_parallel_rank: int | None = None


_batch = msgspec.msgpack.Decoder(_Batch)
_event = msgspec.msgpack.Decoder(KvEvent)


def decode_batch(payload: bytes) -> list[KvEvent]:
    """The events of one published ``KVEventBatch``, those of unknown types left out.
    Raises ``msgspec.DecodeError`` when the payload is no batch at all."""
    events: list[KvEvent] = []
    for raw in _batch.decode(payload).events:
        try:
            events.append(_event.decode(raw))
        except msgspec.ValidationError:
            continue  # a type this reader does not know: nothing it tracks
    return events


def kv_events_argv(endpoint: str, topic: str = "kv") -> list[str]:
    """``vllm serve`` flags that publish its KV-cache events on ``endpoint`` (an
    ``ipc://`` path vLLM binds; a ``tcp://host:port`` without a wildcard it connects to)."""
    config = {
        "enable_kv_cache_events": True,
        "publisher": "zmq",
        "endpoint": endpoint,
        "topic": topic,
    }
    return ["--kv-events-config", json.dumps(config, separators=(",", ":"))]


class KvEventFeed:
    """Receives one engine's KV-cache events and applies them, in order, to ``sink``;
    ``on_gap`` is called when batches were lost (before the next one is applied)."""

    def __init__(
        self,
        endpoint: str,
        sink: Callable[[list[KvEvent]], None],
        on_gap: Callable[[], None],
        topic: str = "kv",
    ) -> None:
        self.endpoint = endpoint
        self._sink = sink
        self._on_gap = on_gap
        self._topic = topic.encode()
        self._next_seq: int | None = None
        self.batches = 0
        self.gaps = 0
        self.undecodable = 0

    def receive(self, seq: int, payload: bytes) -> None:
        """One published message: check its sequence number, decode, apply."""
        if self._next_seq is not None and seq != self._next_seq:
            self.gaps += 1
            log.info("KV events from %s: expected batch %d, got %d; resetting",
                     self.endpoint, self._next_seq, seq)  # fmt: skip
            self._on_gap()
        self._next_seq = seq + 1
        try:
            events = decode_batch(payload)
        except msgspec.DecodeError as exc:
            self.undecodable += 1
            log.warning("undecodable KV event batch from %s: %s", self.endpoint, exc)
            self._on_gap()  # whatever it said is lost
            return
        self.batches += 1
        self._sink(events)

    async def run(self) -> None:
        """Subscribe until cancelled. ZeroMQ reconnects by itself: the engine may
        bind its endpoint after this connects, and again after a restart."""
        context = zmq.asyncio.Context()
        socket = context.socket(zmq.SUB)
        try:
            socket.setsockopt(zmq.RCVHWM, _RECEIVE_HWM)
            socket.setsockopt(zmq.SUBSCRIBE, self._topic)
            socket.connect(self.endpoint)
            while True:
                frames = await socket.recv_multipart()
                if len(frames) != 3 or frames[0] != self._topic:
                    continue
                self.receive(int.from_bytes(frames[1], "big", signed=True), frames[2])
        finally:
            with contextlib.suppress(zmq.ZMQError):
                socket.close(linger=0)
            context.term()

    def start(self) -> asyncio.Task[None]:
        return asyncio.create_task(self.run(), name=f"kv-events-{self.endpoint}")
