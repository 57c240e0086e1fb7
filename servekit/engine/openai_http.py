"""An engine that streams from any OpenAI-compatible server over HTTP.

vLLM (``vllm serve``), TensorRT-LLM (``trtllm-serve``), llama.cpp's server
and this project's own edge agent and central gateway all qualify. Every
request is sent streaming with ``include_usage`` so token accounting comes
from the upstream itself. Failures, error answers and events are read as
everywhere else (``servekit.transport.map_failure``,
``servekit.transport.error_from_response``, ``servekit.sse.EventReader``).

Load is learned by a :data:`LoadProbe` polled in the background: by default
the upstream's own ``/load`` (:func:`servekit.load_reading.read_load_report`);
``probe=None`` for an upstream whose load someone else reads (the central
gateway scrapes its replicas itself).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import functools
import json
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, Literal

import httpx
from pydantic import BaseModel, ConfigDict, Field

from servekit.continuation import TokenCount
from servekit.engine.protocol import (
    Finish,
    GenerationEvent,
    GenerationRequest,
    LoadReport,
    Priority,
    TextDelta,
)
from servekit.errors import ServeError, UpstreamError, UpstreamRejected
from servekit.health_probe import probe_health
from servekit.http_client import UpstreamPool
from servekit.load_reading import read_load_report
from servekit.peers import PeerCredentials, async_client
from servekit.sse import EventReader, event_error
from servekit.transport import (
    FAILURES,
    Transport,
    UpstreamResponse,
    error_from_response,
    map_failure,
)

__all__ = ["LoadProbe", "OpenAIHTTPEngine", "OpenAIHTTPSettings"]

log = logging.getLogger(__name__)

LoadProbe = Callable[[httpx.AsyncClient, str], Awaitable[LoadReport]]

# The project's /load answers from memory; the engine's client waits minutes for answers.
_read_own_load: LoadProbe = functools.partial(read_load_report, timeout_s=2.0)


class OpenAIHTTPSettings(BaseModel):
    """Where the upstream is and how to talk to it."""

    model_config = ConfigDict(extra="forbid")
    base_url: str = Field(description="Server root, e.g. http://10.0.0.5:8000 (no /v1).")
    model: str = Field(description="Model name the upstream serves.")
    served_name: str | None = Field(None, description="Name we expose; default `model`.")
    api_key: str | None = Field(None, description="Bearer token for the upstream.")
    capacity: int = Field(8, ge=1, description="Concurrent requests to send it.")
    connect_timeout_s: float = Field(2.0, gt=0)
    read_timeout_s: float = Field(
        120.0, gt=0, description="Longest silence: before the answer's head, between chunks."
    )
    health_path: str = Field("/health", description="GET path that answers 200 when alive.")
    probe_interval_s: float = Field(1.0, gt=0)
    request_fields: dict[str, Any] = Field(
        default_factory=dict,
        description="Engine-native body fields sent with every request (e.g. vLLM's "
        "ignore_eos or min_tokens for a benchmark deployment); clients cannot set them.",
    )
    send_cache_salt: bool = Field(
        True,
        description="Send the caller's cache scope as `cache_salt` (vLLM, this project's "
        "services: prefixes are reused only within one); off for a server that refuses "
        "unknown fields.",
    )
    engine_errors_as_400: bool = Field(
        False,
        description="The upstream answers its own failures with 400 too (trtllm-serve): "
        "a 400 is retried elsewhere before it is blamed on the request.",
    )


class OpenAIHTTPEngine:
    """Streams completions from one OpenAI-compatible server.

    ``transport`` carries the completions (default: a keep-alive pool of its
    own, closed with the engine); ``client`` the health check and load probe.
    ``peer`` gives both the token and TLS trust to reach the server with.
    """

    def __init__(
        self,
        settings: OpenAIHTTPSettings,
        *,
        transport: Transport | None = None,
        client: httpx.AsyncClient | None = None,
        probe: LoadProbe | None = _read_own_load,
        version: str = "",
        peer: PeerCredentials | None = None,
    ) -> None:
        self.settings = settings
        self.base_url = settings.base_url.rstrip("/").removesuffix("/v1")
        self.version = version
        self._own_transport = transport is None
        self._transport: Transport = transport or UpstreamPool(
            connect_timeout_s=settings.connect_timeout_s, read_timeout_s=settings.read_timeout_s
        )
        self._own_client = client is None
        self._client = client
        self._peer = peer  # token and TLS trust of the client it makes itself
        self._data_peer = _without_token(peer) if settings.api_key else peer
        self._probe = probe
        self._probe_task: asyncio.Task[None] | None = None
        self._last_load = LoadReport(capacity=settings.capacity, model=self.model_name)
        self._healthy = False
        self._in_flight = 0

    @property
    def model_name(self) -> str:
        return self.settings.served_name or self.settings.model

    @property
    def capacity(self) -> int:
        return self.settings.capacity

    def _http(self) -> httpx.AsyncClient:
        if self._client is None:
            s = self.settings
            timeout = httpx.Timeout(s.read_timeout_s, connect=s.connect_timeout_s)
            self._client = async_client(self._peer, timeout=timeout)  # GETs only
        return self._client

    async def start(self) -> None:
        await self.check_health()
        if self._probe is not None and self._probe_task is None:
            self._probe_task = asyncio.create_task(self._probe_loop())

    async def check_health(self) -> bool:
        url = self.base_url + self.settings.health_path
        health = await probe_health(self._http(), url, timeout_s=self.settings.connect_timeout_s)
        if not health.up:
            log.debug("health check of %s: %s", self.base_url, health.reason)
        self._healthy = health.up
        return self._healthy

    async def _probe_loop(self) -> None:
        assert self._probe is not None
        while True:
            try:
                report = await self._probe(self._http(), self.base_url)
                self._last_load = report
                self._healthy = True
            except ServeError as exc:
                log.debug("load probe of %s failed: %s", self.base_url, exc)
                self._healthy = await self.check_health()
            await asyncio.sleep(self.settings.probe_interval_s)

    async def ready(self) -> bool:
        return self._healthy

    def load(self) -> LoadReport:
        r = self._last_load
        return LoadReport(
            **{
                **r.to_dict(),
                "ready": self._healthy,
                "running": max(r.running, self._in_flight),
                "capacity": r.capacity or self.capacity,
                "model": self.model_name,
                "version": r.version or self.version,
            }
        )

    async def aclose(self) -> None:
        if self._probe_task is not None:
            self._probe_task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._probe_task
            self._probe_task = None
        if self._own_client and self._client is not None:
            await self._client.aclose()
            self._client = None
        if self._own_transport:
            await self._transport.close()

    # ------------------------------------------------------------ generation

    def request_body(self, request: GenerationRequest) -> tuple[str, dict[str, Any]]:
        sp = request.sampling
        body: dict[str, Any] = {**self.settings.request_fields, **request.extra}
        body.update(model=self.settings.model, stream=True)
        if request.cache_salt is not None and self.settings.send_cache_salt:
            body["cache_salt"] = request.cache_salt
        body["stream_options"] = {"include_usage": True}
        if request.messages is not None:
            path = "/v1/chat/completions"
            body["messages"] = [{"role": m.role, "content": m.content} for m in request.messages]
            if request.continue_final_message:
                body["continue_final_message"] = True
                body["add_generation_prompt"] = False
        else:
            path = "/v1/completions"
            body["prompt"] = request.prompt or ""
        if sp.max_tokens is not None:
            body["max_tokens"] = sp.max_tokens
        body["temperature"] = sp.temperature
        body["top_p"] = sp.top_p
        if sp.seed is not None:
            body["seed"] = sp.seed
        if sp.stop:
            body["stop"] = list(sp.stop)
        if sp.presence_penalty:
            body["presence_penalty"] = sp.presence_penalty
        if sp.frequency_penalty:
            body["frequency_penalty"] = sp.frequency_penalty
        return path, body

    def generate(self, request: GenerationRequest) -> AsyncIterator[GenerationEvent]:
        return self._generate(request)

    async def _generate(self, request: GenerationRequest) -> AsyncIterator[GenerationEvent]:
        path, body = self.request_body(request)
        headers = {"content-type": "application/json", "x-request-id": request.request_id}
        if request.priority is Priority.BATCH:
            headers["x-priority"] = "batch"
        if request.traceparent is not None:
            headers["traceparent"] = request.traceparent
        if self.settings.api_key:
            headers["authorization"] = f"Bearer {self.settings.api_key}"
        payload = json.dumps(body, ensure_ascii=False, separators=(",", ":")).encode()
        where = self.base_url
        self._in_flight += 1
        resp: UpstreamResponse | None = None
        try:
            # The head waits for the engine's queue: bounded like any silence.
            async with asyncio.timeout(self.settings.read_timeout_s):
                resp = await self._transport.post(
                    self.base_url + path, payload, headers, self._data_peer
                )
            if resp.status != 200:
                raw = await resp.read()
                error = error_from_response(
                    resp.status, raw, resp.headers.get("retry-after"), where
                )
                if resp.status == 400 and self.settings.engine_errors_as_400:
                    raise UpstreamRejected(error)
                raise error
            resp.flowing()  # from the head on, silence past read_timeout_s is an error
            async for event in _events(resp.chunks(), request.kind):
                yield event
        except FAILURES as exc:
            raise map_failure(exc, where) from None
        finally:
            self._in_flight -= 1
            if resp is not None:
                resp.close()  # a no-op once the body was read out and the connection parked


async def _events(
    chunks: AsyncIterator[bytes], kind: Literal["chat", "completion"]
) -> AsyncIterator[GenerationEvent]:
    reader = EventReader(strict=True)
    reason: str | None = None
    usage: dict[str, Any] = {}
    produced = TokenCount()  # from the upstream's usage and token ids, not its chunks
    async for chunk in chunks:
        if reader.done:
            # Read the body to its end (the chunked terminator follows [DONE] at
            # once): a response left unread closes its connection, and the next
            # request to this upstream would pay a new TCP connect on its TTFT.
            continue
        for obj in reader.feed(chunk):
            error = event_error(obj)
            if error is not None:
                raise error
            if isinstance(obj.get("usage"), dict):
                usage = obj["usage"]
            choices = obj.get("choices") or []
            before = produced.tokens
            produced.observe(obj, _choice_text(choices[0], kind) if choices else None)
            for choice in choices:
                text = _choice_text(choice, kind)
                if text:
                    yield TextDelta(text, max(0, produced.tokens - before))
                    before = produced.tokens
                if choice.get("finish_reason"):
                    reason = choice["finish_reason"]
    finished = reader.done
    if not finished and reason is None:
        raise UpstreamError(
            "upstream closed the stream before it finished", code="upstream_disconnected"
        )
    details = usage.get("prompt_tokens_details") or {}
    yield Finish(
        "length" if reason == "length" else "stop",
        int(usage.get("prompt_tokens") or 0),
        int(usage.get("completion_tokens") or produced.tokens),
        int(details.get("cached_tokens") or 0) if isinstance(details, dict) else 0,
    )


def _without_token(peer: PeerCredentials | None) -> PeerCredentials | None:
    """``peer`` without its service token: the engine's own ``api_key`` is sent instead
    (the pool writes a peer's headers on every request, so both would go)."""
    if peer is None or "authorization" not in peer.headers:
        return peer
    headers = {k: v for k, v in peer.headers.items() if k != "authorization"}
    return dataclasses.replace(peer, headers=headers)


def _choice_text(choice: dict[str, Any], kind: str) -> str:
    if kind == "chat":
        delta = choice.get("delta") or {}
        content = delta.get("content") if isinstance(delta, dict) else None
        return content if isinstance(content, str) else ""
    text = choice.get("text")
    return text if isinstance(text, str) else ""
