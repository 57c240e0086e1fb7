"""The engine protocol both tiers share.

An engine streams one completion per request as :data:`GenerationEvent`s:
zero or more :class:`TextDelta` followed by exactly one :class:`Finish`.
Errors are raised as :class:`servekit.errors.ServeError`; an error raised
before the first event (bad prompt, context overflow, upstream refusal) is
one the caller may still turn into a plain HTTP error or a failover.

Nothing outside ``servekit.engine`` knows which implementation it holds.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from enum import IntEnum
from typing import Any, Literal, Protocol, runtime_checkable

from servekit.prefix_blocks import interleaved_union
from servekit.wire import ChatCompletionRequest, CompletionRequest, FinishReason

__all__ = [
    "MAX_POOLED_PREFIX_BLOCKS",
    "Engine",
    "Finish",
    "GenerationEvent",
    "GenerationRequest",
    "LoadReport",
    "Message",
    "Priority",
    "SamplingParams",
    "TextDelta",
    "pooled_figures",
    "prefill_backlog_ahead_ms",
    "slot_hold_ms",
    "slot_release_ms",
    "uncached_tokens",
]


class Priority(IntEnum):
    """Lower value is served first."""

    INTERACTIVE = 0
    BATCH = 1

    @classmethod
    def parse(cls, value: str | None) -> Priority:
        return cls.BATCH if (value or "").lower() == "batch" else cls.INTERACTIVE


@dataclass(frozen=True, slots=True)
class Message:
    role: str
    content: str


@dataclass(frozen=True, slots=True)
class SamplingParams:
    max_tokens: int | None = None
    temperature: float = 1.0
    top_p: float = 1.0
    seed: int | None = None
    stop: tuple[str, ...] = ()
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0

    @property
    def greedy(self) -> bool:
        return self.temperature <= 0.0 or self.top_p <= 0.0


@dataclass(frozen=True, slots=True)
class GenerationRequest:
    """One generation, independent of wire format and engine.

    Exactly one of ``messages`` (chat: the engine applies the model's chat
    template) or ``prompt`` (raw completion) is set. ``extra`` carries body
    fields this system's own services add (vLLM's ``priority``); the wire
    types drop a client's unknown fields, so none of them reach it.
    ``continue_final_message`` renders a trailing assistant message as an
    unfinished turn to be continued (vLLM's parameter of the same name); the
    router uses it to resume a stream on another instance.
    """

    request_id: str
    sampling: SamplingParams
    messages: tuple[Message, ...] | None = None
    prompt: str | None = None
    model: str | None = None
    priority: Priority = Priority.INTERACTIVE
    continue_final_message: bool = False
    extra: Mapping[str, Any] = field(default_factory=dict)
    # The W3C trace context an HTTP engine sends on (tracing on): vLLM continues it.
    traceparent: str | None = None
    # The router's estimate of the prompt tokens this instance must prefill (those it
    # does not hold cached): what admission charges when the engine cannot tell.
    prefill_tokens: int | None = None
    # What the request already spent before it reached this server (a router's
    # earlier attempts, X-Waited-Ms): admission counts it against its TTFT budget.
    waited_ms: int = 0
    # The caller's cache scope (the router's per-tenant salt): an engine reuses a
    # cached prompt prefix only for a request of the same salt, and an HTTP engine
    # sends it on as vLLM's ``cache_salt``.
    cache_salt: str | None = None

    @property
    def kind(self) -> Literal["chat", "completion"]:
        return "chat" if self.messages is not None else "completion"

    @classmethod
    def from_chat(
        cls,
        body: ChatCompletionRequest,
        request_id: str,
        priority: Priority = Priority.INTERACTIVE,
    ) -> GenerationRequest:
        return cls(
            request_id=request_id,
            sampling=_sampling(body, body.token_limit()),
            messages=tuple(Message(m.role, m.text()) for m in body.messages),
            model=body.model,
            priority=priority,
            continue_final_message=body.continue_final_message,
            cache_salt=body.cache_salt,
        )

    @classmethod
    def from_completion(
        cls,
        body: CompletionRequest,
        request_id: str,
        priority: Priority = Priority.INTERACTIVE,
    ) -> GenerationRequest:
        return cls(
            request_id=request_id,
            sampling=_sampling(body, body.token_limit()),
            prompt=body.prompt_text(),
            model=body.model,
            priority=priority,
            cache_salt=body.cache_salt,
        )


def _sampling(body: ChatCompletionRequest | CompletionRequest, limit: int | None) -> SamplingParams:
    return SamplingParams(
        max_tokens=limit,
        temperature=1.0 if body.temperature is None else body.temperature,
        top_p=1.0 if body.top_p is None else body.top_p,
        seed=body.seed,
        stop=tuple(body.stop_list()),
        presence_penalty=body.presence_penalty or 0.0,
        frequency_penalty=body.frequency_penalty or 0.0,
    )


@dataclass(frozen=True, slots=True)
class TextDelta:
    """Newly generated text and how many tokens produced it (may be 0 while a
    multi-byte character or a possible stop sequence is held back)."""

    text: str
    tokens: int = 1


@dataclass(frozen=True, slots=True)
class Finish:
    reason: FinishReason
    prompt_tokens: int
    completion_tokens: int
    cached_prompt_tokens: int = 0


GenerationEvent = TextDelta | Finish


@dataclass(frozen=True, slots=True)
class LoadReport:
    """What an instance tells the fleet about its load; carried by heartbeats.

    ``capacity`` is the number of sequences it runs at once; ``waiting`` are
    admitted requests not yet running. Rates are recent moving figures and
    ``None`` until measured. ``busy_ms_per_seq`` is what each sequence already
    running added to a new request's TTFT beyond its own prefill (a batching
    engine measures it: ``servekit.engine.batching_stats``).

    ``max_context_tokens`` is the longest a single request may be, prompt plus
    completion (vLLM's max model length, llama.cpp's context per slot);
    ``None`` when unknown. ``ttft_budget_ms`` is the TTFT the instance admits
    against (it refuses a request whose predicted TTFT would exceed it), less
    the margin its predictions' recent lateness has earned (``servekit.admission``), and
    ``predicted_wait_ms`` its current prediction of a new request's wait;
    both ``None`` when it does not shed on a budget. ``prefill_backlog_ms`` is
    how long the prompts already admitted but not yet prefilled take at the
    measured prefill rate (a new request's prefill queues behind them); ``None``
    when the engine does not know.
    """

    ready: bool = False
    draining: bool = False
    waiting: int = 0
    running: int = 0
    capacity: int = 1
    queue_limit: int = 0
    ttft_p50_ms: float | None = None
    ttft_p95_ms: float | None = None
    decode_tokens_per_s: float | None = None
    prefill_tokens_per_s: float | None = None
    busy_ms_per_seq: float | None = None
    prefill_backlog_ms: float | None = None
    max_context_tokens: int | None = None
    ttft_budget_ms: float | None = None
    predicted_wait_ms: float | None = None
    model: str = ""
    version: str = ""
    # Cumulative request outcomes since start, for rollout gates (error rate).
    requests_ok: int = 0
    requests_failed: int = 0
    # Cumulative engine counters (tokens), exported as metrics.
    prefix_cache_query_tokens: int = 0
    prefix_cache_hit_tokens: int = 0
    spec_draft_tokens: int = 0
    spec_accepted_tokens: int = 0
    # What the instance's cache holds, as chained block names of the prompts in
    # it (``servekit.prefix_blocks``, blocks of ``prefix_block_chars``
    # characters, a sample of each prompt's names); None when it does not say.
    prefix_blocks: tuple[int, ...] | None = None
    prefix_block_chars: int = 0

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> LoadReport:
        known = {f for f in cls.__dataclass_fields__}
        return cls(**{k: v for k, v in data.items() if k in known})


# The most prefix block names a gateway reports for all its replicas together.
MAX_POOLED_PREFIX_BLOCKS = 4096


def pooled_figures(reports: Sequence[LoadReport], replicas: int) -> LoadReport:
    """A gateway's measured figures from its ``replicas``' reports (the counts,
    readiness and identity are the caller's to set, e.g. with ``dataclasses.replace``).

    TTFT P50, decode and prefill rates are the replicas' means (a request is
    prefilled on one replica), P95 their worst, the
    context window their smallest (a request may land on any of them). The
    gateway reports all its replicas' running sequences as one count; a new
    request lands on one replica and meets about 1/``replicas`` of them, so
    each counts for the replicas' mean busy slowdown divided by their number.

    What the replicas' caches hold is the union of their ``prefix_blocks`` (a
    request of a held prefix is steered to its replica by the gateway's own
    prefix affinity), in the block size most of them report, at most
    :data:`MAX_POOLED_PREFIX_BLOCKS` names; None when no replica says.
    """

    def mean(values: list[float | None]) -> float | None:
        known = [v for v in values if v is not None]
        return sum(known) / len(known) if known else None

    p95 = [r.ttft_p95_ms for r in reports if r.ttft_p95_ms is not None]
    busy = mean([r.busy_ms_per_seq for r in reports])
    windows = [r.max_context_tokens for r in reports if r.max_context_tokens is not None]
    return LoadReport(
        **_pooled_prefixes(reports),
        max_context_tokens=min(windows) if windows else None,
        ttft_p50_ms=mean([r.ttft_p50_ms for r in reports]),
        ttft_p95_ms=max(p95) if p95 else None,
        busy_ms_per_seq=busy / replicas if busy is not None and replicas >= 1 else None,
        decode_tokens_per_s=mean([r.decode_tokens_per_s for r in reports]),
        prefill_tokens_per_s=mean([r.prefill_tokens_per_s for r in reports]),
    )


def _pooled_prefixes(reports: Sequence[LoadReport]) -> dict[str, Any]:
    saying = [r for r in reports if r.prefix_blocks is not None and r.prefix_block_chars > 0]
    if not saying:
        return {}
    sizes = [r.prefix_block_chars for r in saying]
    chars = max(sizes, key=sizes.count)
    held = [r.prefix_blocks or () for r in saying if r.prefix_block_chars == chars]
    names = interleaved_union(held, MAX_POOLED_PREFIX_BLOCKS)
    return {"prefix_blocks": names, "prefix_block_chars": chars}


@runtime_checkable
class Engine(Protocol):
    """A model behind an async streaming interface."""

    @property
    def model_name(self) -> str:
        """The name clients use to address the model."""
        ...

    @property
    def capacity(self) -> int:
        """How many generations it runs at once; the admission queue's width."""
        ...

    async def start(self) -> None:
        """Load and warm the model. Idempotent; ``ready()`` is true afterwards."""
        ...

    def generate(self, request: GenerationRequest) -> AsyncIterator[GenerationEvent]:
        """Stream one generation. Closing the iterator cancels the work."""
        ...

    def load(self) -> LoadReport:
        """The engine's own load: running sequences and recent speeds."""
        ...

    async def ready(self) -> bool: ...

    async def aclose(self) -> None: ...


def prefill_backlog_ahead_ms(engine: object, tokens: int) -> float | None:
    """The prefill a request with ``tokens`` prompt tokens to prefill would wait
    behind on ``engine``, if it tells apart what goes before such a request (one
    that prefills shortest first defines ``prefill_backlog_ahead_ms(tokens)``);
    ``None`` otherwise (its load report's whole backlog is what waits ahead)."""
    ahead = getattr(engine, "prefill_backlog_ahead_ms", None)
    if ahead is None or not callable(ahead):
        return None
    ms = ahead(tokens)
    return float(ms) if isinstance(ms, int | float) else None


def slot_release_ms(engine: object) -> tuple[float, ...] | None:
    """Milliseconds until each of ``engine``'s running sequences frees its slot,
    ascending, if it can tell from what each has left (one that can defines
    ``slot_release_ms()``); ``None`` otherwise (admission then expects each to
    hold its slot for the recent mean hold time)."""
    release = getattr(engine, "slot_release_ms", None)
    if release is None or not callable(release):
        return None
    ms = release()
    return tuple(float(m) for m in ms) if isinstance(ms, tuple) else None


def slot_hold_ms(engine: object, tokens: int, max_tokens: int | None) -> float | None:
    """How long a request with ``tokens`` prompt tokens to prefill and an answer of
    at most ``max_tokens`` would hold a slot of ``engine`` taken now, if it can tell
    (one that can defines ``slot_hold_ms(tokens, max_tokens)``); ``None`` otherwise
    (admission then expects the recent mean hold time)."""
    hold = getattr(engine, "slot_hold_ms", None)
    if hold is None or not callable(hold):
        return None
    ms = hold(tokens, max_tokens)
    return float(ms) if isinstance(ms, int | float) else None


def uncached_tokens(engine: object, request: GenerationRequest) -> int | None:
    """The prompt tokens of ``request`` that ``engine`` would have to prefill were it
    submitted now, if the engine can tell (one that knows what its slots hold
    defines ``uncached_tokens(request)``); ``None`` otherwise."""
    estimate = getattr(engine, "uncached_tokens", None)
    if estimate is None:
        return None
    tokens = estimate(request)
    return tokens if isinstance(tokens, int) else None
