"""OpenTelemetry traces for every service: the ``tracing:`` block and one tracer handle.

Off by default. When off, a service holds :data:`OFF` and its request path
checks one boolean (:attr:`Tracing.enabled`) before touching anything else:
no span object is made, nothing of OpenTelemetry is imported beyond what the
web framework already loads. When on (the ``tracing`` extra installed), each
service has its own tracer provider (never the process-global one, so two
services in one process stay apart): parent-based ratio sampling, a batch
span processor and the OTLP/HTTP exporter.

Spans are started and ended explicitly with a parent span, never through the
ambient context: a routed request crosses tasks and async generators, where a
context manager's attach/detach would not pair up. A stage already timed with
``time.perf_counter`` (an intake step, a queue wait) is written afterwards
with :meth:`Tracing.record`, at the times it really began and ended. W3C
``traceparent`` is read from a caller's headers (when ``trust_incoming``)
and written into the headers of every upstream request.

Spans carry no prompt or completion text and no credentials: only ids,
counts, times, names of tiers, models and instances.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING
from urllib.parse import quote

from pydantic import Field

from servekit.config import Section
from servekit.errors import ServeError

if TYPE_CHECKING:
    from opentelemetry.context import Context
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SpanExporter
    from opentelemetry.trace import Span
    from opentelemetry.util.types import Attributes

    from servekit.settings import InstanceSettings

__all__ = [
    "OFF",
    "EngineTraces",
    "Tracing",
    "TracingSettings",
    "ending",
    "instance_resource",
    "mark_failed",
    "start_tracing",
]


class TracingSettings(Section):
    """OpenTelemetry traces of this service (``tracing:``); needs the ``tracing`` extra."""

    enabled: bool = Field(False, description="Export a trace of every sampled request.")
    endpoint: str = Field(
        "http://127.0.0.1:4318/v1/traces",
        description="OTLP/HTTP traces endpoint (a collector, Jaeger, Tempo, Phoenix).",
    )
    sample_ratio: float = Field(
        1.0,
        ge=0.0,
        le=1.0,
        description="Share of new traces kept; a caller's sampled flag is followed "
        "(parent-based), so one request is traced everywhere or nowhere.",
    )
    service_name: str | None = Field(
        None, description="service.name of the spans (default: the service's own name)."
    )
    trust_incoming: bool = Field(
        True,
        description="Continue a caller's W3C traceparent; off: every request starts a trace.",
    )
    export_delay_ms: int = Field(
        1000, ge=1, description="How long finished spans wait to be exported in one batch."
    )

    def for_engine(self, service: str, resource: Mapping[str, str]) -> EngineTraces | None:
        """Where an engine process this service launches sends its own spans: the same
        collector (``None`` while tracing is off)."""
        if not self.enabled:
            return None
        return EngineTraces(self.endpoint, service, dict(resource))


@dataclass(frozen=True, slots=True)
class EngineTraces:
    """An engine process (``vllm serve``) exporting its spans beside its service's.

    The engine's OpenTelemetry SDK is set up through the standard ``OTEL_*``
    variables (:meth:`environ`): OTLP over HTTP like the services, its own
    ``service.name`` and resource, and a parent-based sampler that is off for
    a request without a sampled caller, so the engine traces exactly the
    requests its service traces (never its warm-up or a probe) and each
    of its spans joins the service's trace through ``traceparent``.
    """

    endpoint: str
    service_name: str
    resource: Mapping[str, str] = field(default_factory=dict)

    def environ(self) -> dict[str, str]:
        attrs = ",".join(f"{k}={quote(v, safe='')}" for k, v in self.resource.items())
        env = {
            "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL": "http/protobuf",
            "OTEL_SERVICE_NAME": self.service_name,
            "OTEL_TRACES_SAMPLER": "parentbased_always_off",
        }
        if attrs:
            env["OTEL_RESOURCE_ATTRIBUTES"] = attrs
        return env


class Tracing:
    """A service's tracer, or nothing: check :attr:`enabled` before any other call."""

    __slots__ = (
        "_empty",
        "_in",
        "_kinds",
        "_offset_ns",
        "_propagator",
        "_provider",
        "_tracer",
        "_trust",
        "enabled",
    )

    def __init__(self, provider: TracerProvider | None = None, *, trust_incoming: bool = True):
        self.enabled = provider is not None
        self._provider = provider
        if provider is None:
            return
        from opentelemetry.context import Context
        from opentelemetry.trace import SpanKind, set_span_in_context
        from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

        self._tracer = provider.get_tracer("hybrid_llm")
        self._propagator = TraceContextTextMapPropagator()
        self._trust = trust_incoming
        # "No parent" is an empty context, never whatever the task's ambient one holds.
        self._empty = Context()
        self._in = set_span_in_context
        self._kinds = (SpanKind.INTERNAL, SpanKind.SERVER)
        # perf_counter seconds to epoch nanoseconds, for stages timed before their span.
        self._offset_ns = time.time_ns() - time.perf_counter_ns()

    def start(
        self,
        name: str,
        *,
        parent: Span | None = None,
        headers: Mapping[str, str] | None = None,
        at: float | None = None,
        server: bool = False,
        attributes: Attributes = None,
    ) -> Span:
        """A started span: ``parent``'s child, else the caller's (``headers``), else a
        root. ``at`` is its start as a ``perf_counter`` reading (default: now)."""
        context: Context
        if parent is not None:
            context = self._in(parent)
        elif headers is not None and self._trust:
            context = self._propagator.extract(headers, context=self._empty)
        else:
            context = self._empty
        start = None if at is None else self.ns(at)
        return self._tracer.start_span(
            name, context=context, kind=self._kinds[server], attributes=attributes, start_time=start
        )

    def record(
        self, name: str, parent: Span, began: float, ended: float, attributes: Attributes = None
    ) -> Span:
        """A finished child of ``parent`` for a stage timed by ``perf_counter``."""
        span = self.start(name, parent=parent, at=began, attributes=attributes)
        span.end(end_time=self.ns(ended))
        return span

    def inject(self, span: Span, headers: dict[str, str]) -> None:
        """Write ``span`` as the parent of an upstream request into ``headers``."""
        self._propagator.inject(headers, context=self._in(span))

    def ns(self, perf: float) -> int:
        """A ``perf_counter`` reading as epoch nanoseconds."""
        return int(perf * 1e9) + self._offset_ns

    def shutdown(self) -> None:
        """Export what is still buffered and stop (the service's lifespan calls it)."""
        if self._provider is not None:
            self._provider.shutdown()


OFF = Tracing()


def mark_failed(span: Span, exc: BaseException) -> None:
    """Mark ``span`` as failed by ``exc``. A client's error (4xx) is described by its
    type, code and parameter only: its message may quote the request body."""
    from opentelemetry.trace import Status, StatusCode

    if isinstance(exc, ServeError) and exc.status < 500:
        what = f"{exc.type} code={exc.code} param={exc.param}"
    else:
        what = str(exc)
    span.set_status(Status(StatusCode.ERROR, f"{type(exc).__name__}: {what}"))


@contextmanager
def ending(span: Span, finished: Callable[[], bool] = lambda: False) -> Iterator[Span]:
    """End a server span with the block, saying how it went: an error (and its HTTP
    status) or, when cancelled before ``finished()``, that the caller left."""
    try:
        yield span
    except asyncio.CancelledError:
        if not finished():  # a caller closing once it has the end cancels too
            span.set_attribute("cancelled", True)
        raise
    except Exception as exc:
        if isinstance(exc, ServeError):
            span.set_attribute("http.response.status_code", exc.status)
        mark_failed(span, exc)
        raise
    finally:
        span.end()


def instance_resource(tier: str, instance: InstanceSettings, model: str) -> dict[str, str]:
    """What every span of an edge agent's or central gateway's says about where it ran."""
    return {
        "hybrid_llm.tier": tier,
        "hybrid_llm.region": instance.region,
        "service.instance.id": instance.id,
        "hybrid_llm.model": model,
    }


def start_tracing(
    settings: TracingSettings,
    service: str,
    resource: Mapping[str, str] | None = None,
    *,
    exporter: SpanExporter | None = None,
) -> Tracing:
    """The service's tracer from its ``tracing:`` block (:data:`OFF` when disabled).

    ``resource`` names what every span comes from (tier, region, instance,
    model); ``exporter`` replaces the OTLP one (tests)."""
    if not settings.enabled:
        return OFF
    try:
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor
        from opentelemetry.sdk.trace.sampling import ParentBased, TraceIdRatioBased
    except ImportError as exc:
        raise RuntimeError(
            "tracing.enabled needs the tracing extra: pip install 'hybrid-llm[tracing]'"
        ) from exc
    if exporter is None:
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

        exporter = OTLPSpanExporter(endpoint=settings.endpoint)
    attrs = {"service.name": settings.service_name or service, **(resource or {})}
    provider = TracerProvider(
        sampler=ParentBased(TraceIdRatioBased(settings.sample_ratio)),
        resource=Resource.create(attrs),
    )
    provider.add_span_processor(
        BatchSpanProcessor(exporter, schedule_delay_millis=settings.export_delay_ms)
    )
    return Tracing(provider, trust_incoming=settings.trust_incoming)
