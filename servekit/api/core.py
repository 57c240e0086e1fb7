"""What a serving instance needs to answer OpenAI requests from an engine."""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any, Protocol, cast

from servekit.admission import AdmissionQueue
from servekit.engine.protocol import Engine, LoadReport, slot_release_ms
from servekit.errors import ContextLengthExceeded, ModelNotFound, NotReady
from servekit.metrics import ServingMetrics
from servekit.tracing import OFF, Tracing

__all__ = ["EngineSource", "FixedEngine", "ServingCore", "core_of"]


class EngineSource(Protocol):
    """Hands out the engine that new requests should use (hot swap changes it)."""

    def current(self) -> Engine: ...


@dataclass
class FixedEngine:
    engine: Engine

    def current(self) -> Engine:
        return self.engine


@dataclass
class ServingCore:
    engines: EngineSource
    admission: AdmissionQueue
    metrics: ServingMetrics
    aliases: frozenset[str] = frozenset()
    version: str = ""
    max_tokens_limit: int | None = None
    draining: bool = False
    stream_deadline_s: float | None = 600.0  # a stream this old (from arrival) is ended
    tracing: Tracing = OFF  # the service's tracer (its lifespan starts and shuts it down)
    requests_ok: int = field(default=0, init=False)
    requests_failed: int = field(default=0, init=False)

    def model_names(self) -> list[str]:
        return [self.engines.current().model_name, *sorted(self.aliases)]

    def check_model(self, name: str) -> None:
        if name not in self.model_names():
            raise ModelNotFound(
                f"The model '{name}' does not exist; this server serves "
                f"{', '.join(repr(n) for n in self.model_names())}.",
                param="model",
            )

    def check_token_limits(self, **limits: int | None) -> None:
        """Reject any token bound past the context window, even one a sibling supersedes."""
        if self.max_tokens_limit is None:
            return
        for name, value in limits.items():
            if value is not None and value > self.max_tokens_limit:
                raise ContextLengthExceeded(
                    f"{name} is too large: {value}. This model's context holds "
                    f"{self.max_tokens_limit} tokens in all.",
                    param=name,
                )

    async def ready(self) -> bool:
        return not self.draining and await self.engines.current().ready()

    def observe_engine(self, backlog_ms: float | None = None) -> LoadReport:
        """The engine's load report, its slowdown, backlog and when its slots free
        handed to admission (``backlog_ms``: the part of the backlog one request
        waits behind, when the engine tells it apart)."""
        engine = self.engines.current()
        report = engine.load()
        backlog = report.prefill_backlog_ms if backlog_ms is None else backlog_ms
        self.admission.observe(report.busy_ms_per_seq, backlog, slot_release_ms(engine))
        return report

    def load(self) -> LoadReport:
        report = self.observe_engine()
        admission = self.admission
        budget = admission.ttft_budget_ms
        return replace(
            report,
            draining=self.draining,
            ready=report.ready and not self.draining,
            waiting=self.admission.waiting,
            running=self.admission.running,
            capacity=self.admission.slots,
            queue_limit=self.admission.max_waiting,
            ttft_budget_ms=admission.budget_now_ms(),  # less its margin: what it judges by
            predicted_wait_ms=None if budget is None else admission.predicted_wait_ms(),
            version=report.version or self.version,
            requests_ok=self.requests_ok,
            requests_failed=self.requests_failed,
        )


def core_of(app: Any) -> ServingCore:
    """The serving core the app's lifespan stored, or 503 while it is starting."""
    core = getattr(getattr(app, "state", None), "core", None)
    if core is None:
        raise NotReady("service is starting", retry_after=1)
    return cast(ServingCore, core)
