"""What the router's handlers share, and the intake every routed body goes through.

:class:`RouterState` is built by the app's lifespan (``geo_router.app``) and
kept on ``app.state.router``. :func:`intake` is the one sequence from a raw
body to a routing decision (authenticate, validate, rate-limit, resolve the
region, plan), used by the completion endpoints and ``/v1/route/explain``
alike. This module imports no handler, so both can import it.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

from geo_router.attempt import Routing
from geo_router.auth import Authenticator, RateLimiter, Tenant
from geo_router.bodycheck import capped_max_tokens, validated_body
from geo_router.classifier import TaskClassifier
from geo_router.continuation import Kind
from geo_router.conversation import estimate_prompt_tokens
from geo_router.feedback import FeedbackBook
from geo_router.metrics import RouterMetrics
from geo_router.planner import Decision, Planner
from geo_router.region import RegionResolver
from geo_router.request import RouteRequest
from geo_router.request_ids import CLIENT_ID_HEADER, client_request_id, new_request_id
from geo_router.settings import RouterSettings
from geo_router.spans import trace_intake
from geo_router.stages import Stages
from geo_router.tracker import Tracker
from servekit.errors import ServeError

if TYPE_CHECKING:
    from opentelemetry.trace import Span

__all__ = ["Intake", "RouterState", "intake"]


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
    stages: Stages  # the intake's stages so far (Server-Timing)
    tenant: Tenant  # whose key: operator or not, its in-flight cap
    charged_tokens: int = 0  # taken from its tokens-per-minute bucket (0: not limited)


async def intake(
    state: RouterState,
    kind: Kind,
    path: str,
    raw: bytes,
    headers: Mapping[str, str],
    peer: str | None,
    *,
    limit: bool = True,
    span: Span | None = None,
) -> Intake:
    """A raw completion body, accepted and planned; raises the client's error if not.

    ``limit=False`` (explain) checks nothing against the tenant's rate limit;
    ``span`` (tracing on) gets the intake's stages as children.
    """
    arrived = time.perf_counter()
    stages = Stages(arrived)
    tenant = state.auth.authenticate(headers.get("authorization"))
    stages.mark("auth")
    body = validated_body(kind, raw)
    routing = state.settings.routing
    budget = capped_max_tokens(body, routing.default_max_tokens, routing.max_tokens_cap)
    stages.mark("body")
    charged = 0
    if limit:
        # Only a tokens-per-minute limit reads the estimate (it walks the whole prompt).
        charged = estimate_prompt_tokens(body) + budget if tenant.tpm is not None else 0
        await state.limiter.check(tenant, charged)
        stages.mark("limit")
    region = state.resolver.resolve(peer, headers)
    stages.mark("region")
    req_id = new_request_id()  # never the client's: vLLM takes it as its own id
    user = body.get("user")
    sticky = user if isinstance(user, str) and user else req_id
    use_case = headers.get("x-use-case")
    salt = tenant.cache_salt
    decision = state.planner.plan(
        body, region, sticky, tenant=tenant.name, use_case=use_case, cache_salt=salt
    )
    if decision.classified_at is not None:
        stages.mark("classify", decision.classified_at)
    stages.mark("plan")
    up_headers = {
        "content-type": "application/json",
        "accept": "text/event-stream",
        "x-priority": tenant.priority,
        "x-request-id": req_id,
    }
    client_id = client_request_id(headers)
    if client_id is not None:
        up_headers[CLIENT_ID_HEADER] = client_id
    req = RouteRequest(
        body, kind, path, region, sticky, up_headers, arrived, tenant.name, use_case, span, salt
    )
    if span is not None:
        trace_intake(state.routing.tracing, span, stages, decision, tenant.name)
    return Intake(req, decision, stages, tenant, charged)
