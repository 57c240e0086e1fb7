"""One streamed request, timed the way users feel it.

TTFT is from just before the request is sent to the first event carrying
generated text; each later text event is one inter-token gap (servers that
stream one token per event, as vLLM, llama.cpp and this project's services do,
make that a true ITL). TPOT is ``(E2E - TTFT) / (tokens - 1)``.

Through the geo router, the route headers say where a request went and the
TTFT the router predicted for it there (``X-Route-Predicted-Ttft-Ms``), which
the summary compares with the TTFT measured here. Its ``Server-Timing`` stages
add up to the router's own time from the request's arrival to its first token
(``router_ttft``): what the router's predictor learns from, beside what the
client saw. ``X-Route-Prediction`` says what the prediction rested on (its
rule, the router's prompt token count, what it counted cached there, its wait
estimate, the instance's own and the running count: ``route_basis`` and the
``router_*`` fields), so a wrong prediction can be told from a wrong belief.
"""

from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass, field
from typing import Any

import httpx

from servekit.sse import EventReader

__all__ = ["RequestRecord", "send_streaming", "server_timing_s"]

PREDICTED_HEADER = "x-route-predicted-ttft-ms"
PREDICTED_P90_HEADER = "x-route-predicted-ttft-p90-ms"
PREDICTION_HEADER = "x-route-prediction"
ROUTE_HEADERS = {
    "tier": "x-route-tier",
    "region": "x-route-region",
    "user_region": "x-route-user-region",
    "reason": "x-route-reason",
    "instance": "x-route-instance",
}


@dataclass
class RequestRecord:
    """What one request measured. Times are seconds; ``start`` is on the run's clock."""

    start: float
    bucket: str
    ok: bool = False
    status: int = 0
    error: str | None = None
    ttft: float | None = None
    e2e: float | None = None
    itl: list[float] = field(default_factory=list)
    output_tokens: int = 0
    prompt_tokens: int = 0
    cached_tokens: int = 0
    tier: str = "-"
    region: str = "-"
    user_region: str = "-"
    reason: str = "-"
    instance: str = "-"
    turn: int = 0  # which turn of its conversation (0: the first)
    retry_after: float | None = None  # a 429's Retry-After, seconds
    predicted_ttft: float | None = None  # the router's predicted median TTFT, seconds
    predicted_ttft_p90: float | None = None  # its P90, once the router learned the instance
    router_ttft: float | None = None  # the router's arrival to first token (its Server-Timing)
    # What the router's prediction rested on (X-Route-Prediction): its rule, and its
    # own prompt token count, cached count there, wait estimate (ms) and running count.
    route_basis: str = "-"
    router_prompt_tokens: int | None = None
    router_cached_tokens: int | None = None
    router_wait_ms: float | None = None
    router_reported_wait_ms: float | None = None  # the instance's predicted wait, as used
    router_running: int | None = None
    router_rtt_ms: float | None = None  # the RTT it priced the instance at
    router_ms_per_token: float | None = None  # the formula's prefill cost of a token there

    @property
    def same_city(self) -> bool:
        """Served in the user's own region (as the router's route headers say)."""
        return self.region != "-" and self.region == self.user_region

    @property
    def tpot(self) -> float | None:
        if self.ttft is None or self.e2e is None or self.output_tokens < 2:
            return None
        return (self.e2e - self.ttft) / (self.output_tokens - 1)

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["tpot"] = self.tpot
        return data


def _text_of(event: dict[str, Any]) -> str:
    choices = event.get("choices") or []
    if not choices:
        return ""
    choice = choices[0]
    delta = choice.get("delta")
    if isinstance(delta, dict):
        return str(delta.get("content") or "")
    return str(choice.get("text") or "")


async def send_streaming(
    client: httpx.AsyncClient,
    path: str,
    body: dict[str, Any],
    *,
    bucket: str,
    run_start: float,
    headers: dict[str, str] | None = None,
    answer: list[str] | None = None,
    turn: int = 0,
) -> RequestRecord:
    """POST ``body`` with ``stream: true`` and time every text event; the text
    goes to ``answer`` when given (a conversation's next turn needs it)."""
    t0 = time.perf_counter()
    record = RequestRecord(start=t0 - run_start, bucket=bucket, turn=turn)
    text_events = 0
    usage_tokens: int | None = None
    last = t0
    try:
        async with client.stream("POST", path, json=body, headers=headers) as response:
            record.status = response.status_code
            for key, header in ROUTE_HEADERS.items():
                value = response.headers.get(header)
                if value:
                    setattr(record, key, value)
            record.predicted_ttft = _seconds(response.headers.get(PREDICTED_HEADER))
            record.predicted_ttft_p90 = _seconds(response.headers.get(PREDICTED_P90_HEADER))
            record.router_ttft = server_timing_s(response.headers.get("server-timing"))
            _read_basis(record, response.headers.get(PREDICTION_HEADER))
            if response.status_code != 200:
                raw = await response.aread()
                record.error = _error_message(response.status_code, raw)
                retry = response.headers.get("retry-after")
                if retry:
                    try:
                        record.retry_after = float(retry)
                    except ValueError:
                        record.retry_after = None
                return record
            reader = EventReader()
            async for chunk in response.aiter_bytes():
                now = time.perf_counter()
                for event in reader.feed(chunk):
                    if "error" in event:
                        record.error = f"stream error: {event['error'].get('message', event)}"
                        continue
                    usage = event.get("usage")
                    if isinstance(usage, dict):
                        usage_tokens = int(usage.get("completion_tokens") or 0)
                        record.prompt_tokens = int(usage.get("prompt_tokens") or 0)
                        details = usage.get("prompt_tokens_details")
                        if isinstance(details, dict):
                            record.cached_tokens = int(details.get("cached_tokens") or 0)
                    text = _text_of(event)
                    if not text:
                        continue
                    if answer is not None:
                        answer.append(text)
                    text_events += 1
                    if record.ttft is None:
                        record.ttft = now - t0
                    else:
                        record.itl.append(now - last)
                    last = now
            record.e2e = time.perf_counter() - t0
            if not reader.done and record.error is None:
                record.error = "stream ended without [DONE]"
    except httpx.HTTPError as exc:
        record.error = f"{type(exc).__name__}: {exc}"
    except (ValueError, KeyError) as exc:
        record.error = f"bad stream event: {exc}"
    record.output_tokens = usage_tokens if usage_tokens else text_events
    record.ok = record.error is None and record.ttft is not None
    if record.ok is False and record.error is None:
        record.error = "no tokens streamed"
    return record


def _seconds(ms: str | None) -> float | None:
    if ms is None:
        return None
    try:
        return float(ms) / 1000.0
    except ValueError:
        return None


def _read_basis(record: RequestRecord, header: str | None) -> None:
    """``X-Route-Prediction`` (``rule; prompt_tokens=N; cached_tokens=N; wait_ms=W;
    reported_wait_ms=W; running=N; rtt_ms=R; ms_per_token=T``) into ``record``; an
    unreadable or missing field stays unknown."""
    if not header:
        return
    rule, *params = (part.strip() for part in header.split(";"))
    record.route_basis = rule or "-"
    values: dict[str, float] = {}
    for param in params:
        name, _, value = param.partition("=")
        try:
            values[name.strip()] = float(value)
        except ValueError:
            continue
    if "prompt_tokens" in values:
        record.router_prompt_tokens = int(values["prompt_tokens"])
    if "cached_tokens" in values:
        record.router_cached_tokens = int(values["cached_tokens"])
    record.router_wait_ms = values.get("wait_ms")
    record.router_reported_wait_ms = values.get("reported_wait_ms")
    if "running" in values:
        record.router_running = int(values["running"])
    record.router_rtt_ms = values.get("rtt_ms")
    record.router_ms_per_token = values.get("ms_per_token")


def server_timing_s(header: str | None) -> float | None:
    """The sum of a ``Server-Timing`` header's durations, in seconds (``None`` without
    one): the router's stages follow one another from arrival to the first token."""
    if not header:
        return None
    total = 0.0
    for metric in header.split(","):
        for param in metric.split(";")[1:]:
            name, _, value = param.strip().partition("=")
            if name == "dur":
                try:
                    total += float(value)
                except ValueError:
                    return None
    return total / 1000.0


def _error_message(status: int, raw: bytes) -> str:
    try:
        message = json.loads(raw)["error"]["message"]
    except (ValueError, KeyError, TypeError):
        message = raw[:200].decode("utf-8", errors="replace")
    return f"HTTP {status}: {message}"
