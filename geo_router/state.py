"""What the router's handlers share, and the intake every routed body goes through.

:class:`RouterState` is built by the app's lifespan (``geo_router.app``) and
kept on ``app.state.router``. :func:`intake` is the one sequence from a raw
body to a routing decision (authenticate, validate, rate-limit, resolve the
region, plan), used by the completion endpoints and ``/v1/route/explain``
alike. This module imports no handler, so both can import it.
"""

from __future__ import annotations

import itertools
import secrets
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from geo_router.auth import Authenticator, RateLimiter
from geo_router.bodycheck import validated_body
from geo_router.classifier import TaskClassifier
from geo_router.continuation import Kind
from geo_router.conversation import estimate_prompt_tokens
from geo_router.feedback import FeedbackBook
from geo_router.metrics import RouterMetrics
from geo_router.planner import Decision, Planner
from geo_router.region import RegionResolver
from geo_router.routed import RouteRequest, Routing
from geo_router.settings import RouterSettings
from geo_router.tracker import Tracker
from servekit.errors import ServeError

__all__ = ["Intake", "RouterState", "intake", "request_id"]

# Request ids: a random per-process prefix and a counter (uuid4 reads the OS
# entropy pool on every call, a system call on the request path).
_ID_PREFIX = "req-" + secrets.token_hex(6)
_ID_COUNTER = itertools.count(1)


def request_id() -> str:
    return f"{_ID_PREFIX}{next(_ID_COUNTER):012x}"


@dataclass(slots=True)
class RouterState:
    """Everything a handler needs, built by the lifespan."""

    settings: RouterSettings
    auth: Authenticator
    limiter: RateLimiter
    resolver: RegionResolver
    classifier: TaskClassifier
    planner: Planner
    tracker: Tracker
    routing: Routing
    metrics: RouterMetrics
    stale: Callable[[], bool]  # discovery runs on a last-known catalog
    feedback: FeedbackBook

    def refused(self, exc: ServeError) -> None:
        """Count a request refused before routing (a client error)."""
        if exc.status < 500:
            self.metrics.rejected.labels(str(exc.status)).inc()


@dataclass(slots=True)
class Intake:
    request: RouteRequest
    decision: Decision
    tenant: str


def intake(
    state: RouterState,
    kind: Kind,
    path: str,
    raw: bytes,
    headers: Mapping[str, str],
    peer: str | None,
    *,
    limit: bool = True,
) -> Intake:
    """A raw completion body, accepted and planned; raises the client's error if not.

    ``limit=False`` (explain) checks nothing against the tenant's rate limit.
    """
    arrived = time.perf_counter()
    tenant = state.auth.authenticate(headers.get("authorization"))
    body = validated_body(kind, raw)
    if limit:
        cap = body.get("max_completion_tokens") or body.get("max_tokens")
        budget = cap if isinstance(cap, int) else state.settings.routing.default_max_tokens
        state.limiter.check(tenant, estimate_prompt_tokens(body) + budget)
    region = state.resolver.resolve(peer, headers)
    req_id = headers.get("x-request-id") or request_id()
    user = body.get("user")
    sticky = user if isinstance(user, str) and user else req_id
    use_case = headers.get("x-use-case")
    decision = state.planner.plan(body, region, sticky, tenant=tenant.name, use_case=use_case)
    upstream = dict(body)
    upstream["stream"] = True
    if not body["stream"]:
        upstream["stream_options"] = {"include_usage": True}
    up_headers = {
        "content-type": "application/json",
        "accept": "text/event-stream",
        "x-priority": tenant.priority,
        "x-request-id": req_id,
    }
    req = RouteRequest(body, kind, path, region, sticky, up_headers, arrived, upstream)
    return Intake(req, decision, tenant.name)
