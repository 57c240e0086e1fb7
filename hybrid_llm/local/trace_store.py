"""Reading traces back from the local topology's trace store (Arize Phoenix).

``hybrid-llm up --tracing`` runs Phoenix and points every service's OTLP
exporter at it; this asks Phoenix's REST API for what it stored:
``GET /v1/projects/{project}/spans?trace_id=...`` (attributes come back
flat, ``route.tier`` as it was sent; times as ISO 8601 with microseconds).
Phoenix keeps no resource attributes (``service.name``, the instance): a
span says where it ran through its own attributes (``serve.tier``,
``route.instance``). Tests and studies that need a trace as stored use this.
"""

from __future__ import annotations

import time
from collections.abc import Collection, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

import httpx

__all__ = ["DEFAULT_PROJECT", "StoredSpan", "fetch_trace", "wait_for_trace"]

DEFAULT_PROJECT = "default"  # where Phoenix files spans that name no project


def _seconds(iso: str) -> float:
    return datetime.fromisoformat(iso).timestamp()


@dataclass(frozen=True)
class StoredSpan:
    """One span as the trace store returns it; times are epoch seconds."""

    name: str
    trace_id: str
    span_id: str
    parent_id: str | None
    start: float
    end: float
    status: str
    attributes: dict[str, Any] = field(default_factory=dict)
    events: dict[str, float] = field(default_factory=dict)  # name -> its time

    @property
    def duration_ms(self) -> float:
        return (self.end - self.start) * 1e3

    @classmethod
    def from_phoenix(cls, data: dict[str, Any]) -> StoredSpan:
        return cls(
            name=str(data["name"]),
            trace_id=str(data["context"]["trace_id"]),
            span_id=str(data["context"]["span_id"]),
            parent_id=data.get("parent_id") or None,
            start=_seconds(data["start_time"]),
            end=_seconds(data["end_time"]),
            status=str(data.get("status_code", "UNSET")),
            attributes=dict(data.get("attributes") or {}),
            events={str(e["name"]): _seconds(e["timestamp"]) for e in data.get("events") or []},
        )


def fetch_trace(
    client: httpx.Client, base_url: str, trace_id: str, project: str = DEFAULT_PROJECT
) -> list[StoredSpan]:
    """Every span of ``trace_id`` the store holds now (it pages by 1000)."""
    spans: list[StoredSpan] = []
    params: dict[str, Any] = {"trace_id": trace_id, "limit": 1000}
    while True:
        r = client.get(f"{base_url}/v1/projects/{project}/spans", params=params)
        if r.status_code == 404:  # no span has reached the project yet
            return spans
        r.raise_for_status()
        body = r.json()
        spans += [StoredSpan.from_phoenix(s) for s in body.get("data") or []]
        cursor = body.get("next_cursor")
        if not cursor:
            return spans
        params["cursor"] = cursor


def wait_for_trace(
    client: httpx.Client,
    base_url: str,
    trace_id: str,
    names: Collection[str],
    *,
    timeout: float = 30.0,
    project: str = DEFAULT_PROJECT,
) -> Sequence[StoredSpan]:
    """The trace once a span of each of ``names`` arrived (exporters batch: a second
    or so); ``TimeoutError`` naming the ones still missing."""
    deadline = time.monotonic() + timeout
    while True:
        spans = fetch_trace(client, base_url, trace_id, project)
        missing = set(names) - {s.name for s in spans}
        if not missing:
            return spans
        if time.monotonic() > deadline:
            raise TimeoutError(f"trace {trace_id}: no {sorted(missing)} after {timeout:g}s")
        time.sleep(0.2)
