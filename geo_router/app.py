"""``create_app(settings)``: the router's ASGI app; its lifespan owns every client.

The lifespan builds the upstream connection pool, the candidate sources (static
upstreams polled by URL, the registry when configured) and their refresh
loops, the catalog's follower (``geo_router.membership``), the GeoIP reader,
and the routing parts; handlers reach them through
:class:`RouterState` on ``app.state``. Tests may pass ``candidates`` /
``traffic`` (the discovery seam).
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import random
from collections.abc import AsyncIterator, Mapping

from fastapi import FastAPI

from geo_router.attempt import Routing
from geo_router.auth import Authenticator, RateLimiter
from geo_router.catalog import (
    CandidateSource,
    TrafficPoller,
    TrafficSource,
    cancel_all,
    open_discovery,
)
from geo_router.classifier import TaskClassifier
from geo_router.completions import route_completion
from geo_router.continuation import Kind
from geo_router.feedback import FeedbackBook, publish_acceptance, source_name
from geo_router.limits import build_buckets
from geo_router.membership import Membership
from geo_router.metrics import RouterMetrics
from geo_router.openapi import ERROR_RESPONSES, install_openapi
from geo_router.ops import RouterOps, router_state
from geo_router.peers import PeerBook
from geo_router.planner import Planner
from geo_router.prefix_index import PrefixIndex
from geo_router.region import RegionResolver, open_geoip
from geo_router.routes import explain_router
from geo_router.scoring import Scorer
from geo_router.settings import RouterSettings
from geo_router.state import RouterState
from geo_router.tracker import Tracker
from servekit.api.service import create_service_app
from servekit.asgi import DisconnectWatch, Scope, Send
from servekit.errors import NotReady, ServeError
from servekit.http_client import UpstreamPool
from servekit.serve_cli import ServiceHooks
from servekit.tracing import start_tracing

__all__ = ["RouterState", "create_app"]


def create_app(
    settings: RouterSettings,
    *,
    candidates: CandidateSource | None = None,
    traffic: TrafficSource | None = None,
    rng: random.Random | None = None,
) -> FastAPI:
    """Build the router. ``candidates``/``traffic`` replace discovery (tests, simulators).

    The completion endpoints are plain ASGI middleware in front of the
    FastAPI routes (:class:`~servekit.api.endpoints.CompletionEndpoints`);
    ``app.state.hooks`` drains it and reloads its API keys (``geo-router serve``).
    """
    metrics = RouterMetrics()

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        # The TTFT deadline is enforced per attempt by the dispatcher; the read
        # timeout bounds the gap between chunks once a stream flows (not the wait
        # for its first bytes: a long cold prefill comes before them).
        client = UpstreamPool(
            connect_timeout_s=settings.connect_timeout_s,
            read_timeout_s=settings.routing.idle_timeout_s,
            keepalive_s=30.0,
        )
        async with contextlib.AsyncExitStack() as stack:
            stack.push_async_callback(client.close)
            peers = PeerBook(settings.peers, settings.upstreams)
            stack.push_async_callback(peers.aclose)
            geo = open_geoip(settings.region)
            if geo is not None:
                stack.callback(geo.close)
            found = await open_discovery(
                stack,
                upstreams=settings.upstreams,
                registry=settings.registry,
                poll_interval_s=settings.poll_interval_s,
                given=candidates,
                metrics_registry=metrics.registry,
                probe_client_for=peers.probe_client,
            )
            traffic_source = _traffic(settings, traffic, found.traffic)
            tracker = Tracker(settings.routing.breaker, settings.routing.prediction)
            membership = Membership(found.candidates, tracker)
            membership.refresh()
            following = asyncio.create_task(membership.run(settings.poll_interval_s))
            stack.push_async_callback(cancel_all, [following])
            region = settings.region
            scorer = Scorer(
                settings.routing,
                region.rtt_table(),
                tracker,
                rng,
                measured_rtt_region=region.default if region.measured_rtt else None,
            )
            classifier = TaskClassifier.load(
                settings.classifier.weights,
                settings.classifier.threshold,
                settings.classifier.policy,
            )
            cache = settings.routing.prefix_cache
            prefixes = (
                PrefixIndex(
                    block_chars=cache.block_chars,
                    max_blocks=cache.max_blocks,
                    ttl_s=cache.ttl_s,
                    anchor_chars=cache.anchor_chars,
                )
                if cache.enabled
                else None
            )
            planner = Planner(
                settings.routing,
                classifier,
                scorer,
                tracker,
                found.candidates,
                traffic_source,
                prefixes,
                membership.known,
            )
            limiter = RateLimiter(
                build_buckets(settings.auth.limits, lambda down: metrics.limits_fallback.set(down))
            )
            stack.push_async_callback(limiter.aclose)
            tracing = start_tracing(settings.tracing, "geo-router", {"hybrid_llm.tier": "router"})
            stack.callback(tracing.shutdown)
            feedback = FeedbackBook(metrics.registry, log=settings.feedback_log)
            app.state.router = RouterState(
                settings=settings,
                auth=Authenticator(settings.auth),
                limiter=limiter,
                resolver=RegionResolver(settings.region, geo),
                classifier=classifier,
                planner=planner,
                tracker=tracker,
                routing=Routing(
                    client,
                    tracker,
                    metrics,
                    settings.routing,
                    prefixes,
                    peers.for_instance,
                    tracing,
                ),
                metrics=metrics,
                stale=found.stale,
                feedback=feedback,
            )
            if found.kv is not None:
                source = source_name(settings.server.port)
                publishing = asyncio.create_task(
                    publish_acceptance(feedback, found.kv, source, settings.poll_interval_s)
                )
                stack.push_async_callback(cancel_all, [publishing])
            # Everything built so far (FastAPI, pydantic, the catalog) lives as
            # long as the process: keep it out of the collector's full passes,
            # whose cost grows with the whole heap and lands on whichever
            # requests are in flight at the time.
            gc.freeze()
            stack.callback(gc.unfreeze)
            yield

    def state() -> RouterState:
        return router_state(app)

    def refused(exc: ServeError) -> None:
        with contextlib.suppress(NotReady):
            state().refused(exc)

    async def complete(
        scope: Scope, kind: Kind, raw: bytes, _arrival: float, send: Send, watch: DisconnectWatch
    ) -> None:
        await route_completion(state(), scope, kind, raw, send, watch)

    def drain() -> None:
        router_ops: RouterOps = app.state.ops
        router_ops.draining = True  # /ready turns 503 while in-flight streams finish

    def reload(fresh: RouterSettings) -> None:
        with contextlib.suppress(NotReady):
            state().auth.update(fresh.auth)

    app = create_service_app(
        title="hybrid-llm geo router",
        version="0.1.0",
        lifespan=lifespan,
        ops=RouterOps,
        hooks=ServiceHooks(drain=drain, reload=reload),
        document=install_openapi,
        max_body_bytes=settings.server.max_body_bytes,
        complete=complete,
        on_error=refused,
        routers=[explain_router()],
        models_responses=ERROR_RESPONSES,
    )
    return app


def _traffic(
    settings: RouterSettings, given: TrafficSource | None, poller: TrafficPoller | None
) -> TrafficSource:
    static = settings.traffic

    def lookup(model: str) -> Mapping[str, float] | None:
        for source in (given, poller.traffic if poller is not None else None):
            if source is not None:
                found = source(model)
                if found:
                    return found
        return static.get(model)

    return lookup
