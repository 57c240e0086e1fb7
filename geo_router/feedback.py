"""Users' ratings of answers, per tier, model version and task type.

``POST /v1/feedback`` takes ``{"response_id", "score" | "thumbs", "comment"?}``
with the tenant's API key. ``response_id`` is the ``id`` of the completion
the router returned (``chatcmpl-...``) or its ``X-Request-Id``; only the
tenant that was served it may rate it (another tenant's id is as unknown as a
made-up one: 404), once (409). ``thumbs`` is ``up`` (score 1) or ``down``
(0); ``score`` is a number in 0..1. A rating of at least 0.5 counts as an
accepted answer.

The book remembers the last ``max_served`` answers (oldest forgotten first)
and counts ratings in Prometheus (``router_feedback_total``,
``router_feedback_score``) labelled by tier, model, version and task type,
and in :meth:`FeedbackBook.acceptance` per model version, which
:func:`publish_acceptance` writes to the registry's KV store for model_sync's
acceptance gate (``docs/model_sync.md``). A router that restarts counts again
from zero under the same name. With ``log`` set, every
rating is appended to a JSON-lines file (``geo-router eval-classifier
--feedback`` reports acceptance per task type from it).
"""

from __future__ import annotations

import asyncio
import json
import logging
import re
import socket
import time
from collections import OrderedDict
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Histogram

from servekit.errors import Conflict, InvalidRequest, NotFound
from servekit.registry.protocol import KVStore, RegistryError

log = logging.getLogger(__name__)

__all__ = [
    "RATING_SCHEMA",
    "Acceptance",
    "FeedbackBook",
    "Rating",
    "Served",
    "parse_rating",
    "publish_acceptance",
    "source_name",
]

MAX_COMMENT_CHARS = 2000
ACCEPTED = 0.5


@dataclass(slots=True)
class Served:
    """One answer the router served: who got it and what produced it."""

    tenant: str
    tier: str
    model: str
    version: str
    task: str  # "-" when the request pinned a tier or a model
    rating: float | None = None


@dataclass(frozen=True, slots=True)
class Rating:
    response_id: str
    score: float
    comment: str | None


@dataclass(slots=True)
class Acceptance:
    rated: int = 0
    accepted: int = 0


# The body's JSON schema, for the OpenAPI document (parse_rating is what enforces it).
RATING_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "response_id": {"type": "string", "minLength": 1, "maxLength": 200},
        "score": {"type": "number", "minimum": 0, "maximum": 1},
        "thumbs": {"type": "string", "enum": ["up", "down"]},
        "comment": {"type": "string", "maxLength": MAX_COMMENT_CHARS},
    },
    "required": ["response_id"],
    "oneOf": [{"required": ["score"]}, {"required": ["thumbs"]}],
}


def parse_rating(body: Any) -> Rating:
    """A feedback body, or ``InvalidRequest`` naming the bad field."""
    if not isinstance(body, Mapping):
        raise InvalidRequest("the body must be a JSON object")
    rid = body.get("response_id")
    if not isinstance(rid, str) or not rid or len(rid) > 200:
        raise InvalidRequest("response_id must be a non-empty string", param="response_id")
    score, thumbs = body.get("score"), body.get("thumbs")
    if (score is None) == (thumbs is None):
        raise InvalidRequest("give exactly one of score and thumbs", param="score")
    if thumbs is not None:
        if thumbs not in ("up", "down"):
            raise InvalidRequest("thumbs must be 'up' or 'down'", param="thumbs")
        value = 1.0 if thumbs == "up" else 0.0
    else:
        if isinstance(score, bool) or not isinstance(score, int | float) or not 0 <= score <= 1:
            raise InvalidRequest("score must be a number in 0..1", param="score")
        value = float(score)
    comment = body.get("comment")
    if comment is not None and (not isinstance(comment, str) or len(comment) > MAX_COMMENT_CHARS):
        raise InvalidRequest(
            f"comment must be a string of at most {MAX_COMMENT_CHARS} characters", param="comment"
        )
    return Rating(rid, value, comment)


class FeedbackBook:
    def __init__(
        self, registry: CollectorRegistry, max_served: int = 100_000, log: Path | None = None
    ) -> None:
        self._served: OrderedDict[str, Served] = OrderedDict()
        self._max = max_served
        self._log = log
        self._acceptance: dict[tuple[str, str], Acceptance] = {}
        labels = ["tier", "model", "version", "task", "verdict"]
        self.total = Counter(
            "router_feedback", "Users' ratings of answers.", labels, registry=registry
        )
        self.scores = Histogram(
            "router_feedback_score",
            "Users' rating scores (0..1).",
            labels[:-1],
            buckets=(0.25, 0.5, 0.75, 1.0),
            registry=registry,
        )

    def served(self, response_ids: Iterable[str], record: Served) -> None:
        """Remember an answer under each of its ids (the upstream's and the router's)."""
        for rid in response_ids:
            if rid:
                self._served[rid] = record
                self._served.move_to_end(rid)
        while len(self._served) > self._max:
            self._served.popitem(last=False)

    async def rate(self, tenant: str, rating: Rating) -> Served:
        record = self._served.get(rating.response_id)
        if record is None or record.tenant != tenant:
            raise NotFound(
                f"no answer {rating.response_id!r} was served to this key", param="response_id"
            )
        if record.rating is not None:
            raise Conflict(f"answer {rating.response_id!r} is already rated", param="response_id")
        record.rating = rating.score
        verdict = "accepted" if rating.score >= ACCEPTED else "rejected"
        labels = (record.tier, record.model, record.version, record.task)
        self.total.labels(*labels, verdict).inc()
        self.scores.labels(*labels).observe(rating.score)
        acc = self._acceptance.setdefault((record.model, record.version), Acceptance())
        acc.rated += 1
        acc.accepted += rating.score >= ACCEPTED
        if self._log is not None:
            line = {"time": time.time(), **asdict(record), "comment": rating.comment}
            await asyncio.to_thread(_append, self._log, json.dumps(line, ensure_ascii=False))
        return record

    def acceptance(self) -> dict[tuple[str, str], Acceptance]:
        """Ratings so far per (model, version)."""
        return dict(self._acceptance)


def _append(path: Path, line: str) -> None:
    with path.open("a", encoding="utf-8") as out:
        out.write(line + "\n")


def source_name(port: int) -> str:
    """This router's name among the feedback reporters: host and port, as a key segment."""
    host = re.sub(r"[^A-Za-z0-9._-]", "-", socket.gethostname()) or "router"
    return f"{host.lstrip('.-_') or 'router'}-{port}"[:120]


async def publish_acceptance(
    book: FeedbackBook, kv: KVStore, source: str, interval_s: float
) -> None:
    """Write this router's counts to ``models/<model>/feedback/<version>/<source>``
    (what model_sync's acceptance gate sums) whenever they changed."""
    written: dict[tuple[str, str], tuple[int, int]] = {}
    while True:
        for (model, version), acc in book.acceptance().items():
            now = (acc.rated, acc.accepted)
            if written.get((model, version)) == now or "/" in model + version:
                continue
            value = json.dumps({"rated": acc.rated, "accepted": acc.accepted}).encode()
            try:
                await kv.put(f"models/{model}/feedback/{version}/{source}", value)
            except (RegistryError, OSError) as exc:
                log.debug("feedback counts not published: %s", exc)
                continue
            written[(model, version)] = now
        await asyncio.sleep(interval_s)
