"""What a vLLM engine's prefix cache holds, named as the routers name prefixes.

vLLM reports its cache in token blocks (:mod:`servekit.engine.kv_events`);
routers look prefixes up by chained names of character blocks of the
conversation text (:mod:`servekit.prefix_blocks`). The bridge is the request:

- each chat request sent to the engine is recorded (its text length and block
  names in its cache scope) under a fresh ``session_id`` body field, and asks
  for ``kv_cache_report_mode: full`` (``vllm_xargs``), so vLLM tags the blocks
  it stores for the request *and* those it reuses from the cache with that id;
- the ``BlockStored`` events of a session give that prompt's chain of block
  hashes; ``BlockRemoved``/``AllBlocksCleared`` (and a restart or a gap in the
  feed: :meth:`HeldPrefixes.reset`) say which are gone;
- at report time a prompt's held tokens are its leading run of chain blocks
  still stored (vLLM's cache only ever hits a leading run), and its held
  characters that share of its text: ``held tokens / prompt tokens`` of the
  text's length. The prompt tokens are the engine's own count once the request
  finished, before that the text at the characters per token measured so far.

It is an approximation: the share is proportional (the chat template's own
tokens sit at the start of the token side and are not in the text), and a
block's characters are credited whole or not at all. The cache scope is
exact: vLLM salts its block hashes with the request's ``cache_salt``, and the
names start from the same salt's seed. The token ids the events carry are
not used (and not kept): the session ids tie blocks to prompts.

Bounded: ``max_prompts`` recent prompts (a report covers each with
``sampled`` names, every ``stride``-th and its last) and ``max_blocks`` stored
block hashes (the oldest forgotten first; a forgotten block reads as
evicted, which under-credits, never over-credits).
"""

from __future__ import annotations

import dataclasses
import itertools
import math
import secrets
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any

from servekit.engine.kv_events import AllBlocksCleared, BlockHash, BlockRemoved, KvEvent
from servekit.engine.prompt_estimate import request_blocks
from servekit.engine.protocol import GenerationRequest
from servekit.prefix_blocks import sampled

__all__ = ["HeldPrefixes"]

# The medium of vLLM's own KV cache in its events (offloading tiers report others).
_ENGINE_MEDIA = (None, "GPU")
# Before any prompt was tokenized (English prose runs about four characters a
# token; the first requests replace this).
DEFAULT_CHARS_PER_TOKEN = 4.0
# How much of the measured ratio each new prompt replaces, by its length: the
# sums decay so that a change of language shows within a few dozen prompts.
_DECAY = 0.9


@dataclass(slots=True)
class _Prompt:
    chars: int  # length of the conversation text the names are taken over (conversation_text)
    names: tuple[int, ...]
    prompt_tokens: int | None = None
    block_tokens: int = 0
    chain: list[BlockHash] = field(default_factory=list)


class HeldPrefixes:
    """The names of what one vLLM engine's prefix cache holds (see the module docstring).
    Owned by one event loop: requests, the event feed and load reports all run there."""

    def __init__(
        self,
        block_chars: int = 64,
        stride: int = 4,
        *,
        max_prompts: int = 64,
        max_blocks: int = 65_536,
    ) -> None:
        self.block_chars = block_chars
        self.stride = stride
        self.max_prompts = max_prompts
        self.max_blocks = max_blocks
        self._prompts: OrderedDict[str, _Prompt] = OrderedDict()
        self._stored: OrderedDict[BlockHash, BlockHash | None] = OrderedDict()  # hash → parent
        self._ids = itertools.count()
        self._prefix = f"hp-{secrets.token_hex(3)}-"  # this engine's sessions
        self._chars = 0.0
        self._tokens = 0.0
        self._report: tuple[int, ...] | None = None

    @property
    def chars_per_token(self) -> float:
        return self._chars / self._tokens if self._tokens else DEFAULT_CHARS_PER_TOKEN

    # -- requests ----------------------------------------------------------

    def tag(self, request: GenerationRequest) -> GenerationRequest:
        """``request`` as it is sent: a chat request with whole blocks gets a session
        id and asks vLLM to report the blocks it reuses; any other is left alone."""
        names = request_blocks(request, self.block_chars)
        if not names:
            return request
        session = f"{self._prefix}{next(self._ids)}"
        chars = sum(len(m.role) + len(m.content) + 2 for m in request.messages or ())
        self._prompts[session] = _Prompt(chars=chars, names=names)
        while len(self._prompts) > self.max_prompts:
            self._prompts.popitem(last=False)
        xargs = {**request.extra.get("vllm_xargs", {}), "kv_cache_report_mode": "full"}
        extra = {**request.extra, "session_id": session, "vllm_xargs": xargs}
        return dataclasses.replace(request, extra=extra)

    def finished(self, request: GenerationRequest, prompt_tokens: int) -> None:
        """A tagged request's prompt came to ``prompt_tokens`` tokens (its usage)."""
        session = request.extra.get("session_id")
        prompt = self._prompts.get(session) if isinstance(session, str) else None
        if prompt is None or prompt_tokens <= 0:
            return
        prompt.prompt_tokens = prompt_tokens
        self._chars = _DECAY * self._chars + prompt.chars
        self._tokens = _DECAY * self._tokens + prompt_tokens
        self._report = None

    # -- the event feed ----------------------------------------------------

    def apply(self, events: list[KvEvent]) -> None:
        """One batch of the engine's KV-cache events, in order."""
        for event in events:
            if isinstance(event, AllBlocksCleared):
                self._stored.clear()
            elif event.medium not in _ENGINE_MEDIA or event.group_idx not in (None, 0):
                continue
            elif isinstance(event, BlockRemoved):
                for block in event.block_hashes:
                    self._stored.pop(block, None)
            else:
                parent = event.parent_block_hash
                prompt = self._prompts.get(event.session_id or "")
                if prompt is not None:
                    prompt.chain = self._chain_to(prompt.chain, parent) + event.block_hashes
                    prompt.block_tokens = event.tokens_per_block
                for block in event.block_hashes:
                    self._stored.pop(block, None)  # stored again: the newest
                    self._stored[block] = parent
                    parent = block
                while len(self._stored) > self.max_blocks:
                    self._stored.popitem(last=False)
        self._report = None

    def _chain_to(self, chain: list[BlockHash], parent: BlockHash | None) -> list[BlockHash]:
        """The chain of blocks ending in ``parent``: the prompt's own where it has
        it, else by walking the stored blocks' parents."""
        if parent is None:
            return []
        if chain and chain[-1] == parent:
            return chain
        walked: list[BlockHash] = []
        block: BlockHash | None = parent
        while block is not None and block in self._stored and len(walked) < self.max_blocks:
            walked.append(block)
            block = self._stored[block]
        walked.reverse()
        return walked

    def reset(self) -> None:
        """The engine's cache is gone or unknown (a restart, events lost)."""
        self._stored.clear()
        for prompt in self._prompts.values():
            prompt.chain = []
        self._report = None

    # -- the load report ---------------------------------------------------

    def held_blocks(self) -> tuple[int, ...]:
        """Sampled names of every recorded prompt's held part, most recent first."""
        if self._report is not None:
            return self._report
        names: dict[int, None] = {}
        for prompt in reversed(self._prompts.values()):
            held = self._held_names(prompt)
            names.update(dict.fromkeys(sampled(prompt.names[:held], self.stride)))
        self._report = tuple(names)
        return self._report

    def _held_names(self, prompt: _Prompt) -> int:
        run = 0
        for block in prompt.chain:
            if block not in self._stored:
                break
            run += 1
        if not run:
            return 0
        tokens = prompt.prompt_tokens or math.ceil(prompt.chars / self.chars_per_token)
        share = min(1.0, run * prompt.block_tokens / max(1, tokens))
        return min(len(prompt.names), int(prompt.chars * share) // self.block_chars)

    def report(self) -> dict[str, Any]:
        """The :class:`~servekit.engine.protocol.LoadReport` fields it fills."""
        return {"prefix_blocks": self.held_blocks(), "prefix_block_chars": self.block_chars}
