"""One served request's spans on an edge agent or the central gateway.

``serve.request`` (server span, the router attempt's child through
``traceparent``) holds the request's id, tier, model and version, and at the
end its prompt, cached and completion tokens; its children are the stages
of its time to first token and after:

Under a TTFT budget it also holds what admission predicted on arrival
(``serve.predicted_wait_ms``, ``serve.own_prefill_ms``).

* ``serve.queue``: waiting for admission (``servekit.admission``);
* ``serve.prefill``: from admission to the engine's first event (the
  engine's own scheduling and the prompt's prefill);
* ``serve.decode``: from the first token to the finish.

The engine gets the request span as its parent too (``GenerationRequest.traceparent``:
vLLM continues it with ``--otlp-traces-endpoint``). No prompt or answer text
is recorded.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

from servekit.engine.protocol import Finish
from servekit.tracing import Tracing

if TYPE_CHECKING:
    from opentelemetry.trace import Span

__all__ = ["ServingTrace"]


class ServingTrace:
    """The stages of one served request, written as children of its span."""

    __slots__ = ("_admitted", "_first", "finished_at", "span", "tracing")

    def __init__(self, tracing: Tracing, span: Span) -> None:
        self.tracing = tracing
        self.span = span
        self._admitted: float | None = None
        self._first: float | None = None
        self.finished_at = 0.0  # perf_counter of the finish; 0 until then

    def predicted(self, wait_ms: float | None, own_prefill_ms: float) -> None:
        """What admission predicted for it on arrival: the wait ahead (absent when
        unknown) and its own uncached prefill, so a slow first token can be read
        against the promise it was admitted on."""
        if wait_ms is not None:
            self.span.set_attribute("serve.predicted_wait_ms", wait_ms)
        self.span.set_attribute("serve.own_prefill_ms", own_prefill_ms)

    def admitted(self, queue_time_s: float) -> None:
        """Admission granted now, after ``queue_time_s`` in the queue."""
        now = self._admitted = time.perf_counter()
        self.span.set_attribute("serve.queue_ms", queue_time_s * 1e3)
        self.tracing.record("serve.queue", self.span, now - queue_time_s, now)

    def first_token(self) -> None:
        now = self._first = time.perf_counter()
        self.span.add_event("first_token")
        if self._admitted is not None:
            self.tracing.record("serve.prefill", self.span, self._admitted, now)

    def finished(self, finish: Finish) -> None:
        now = self.finished_at = time.perf_counter()
        self.span.set_attributes(
            {
                "serve.prompt_tokens": finish.prompt_tokens,
                "serve.cached_prompt_tokens": finish.cached_prompt_tokens,
                "serve.completion_tokens": finish.completion_tokens,
                "serve.finish_reason": finish.reason,
            }
        )
        began = self._first if self._first is not None else self._admitted
        if began is not None:
            self.tracing.record("serve.decode", self.span, began, now)
