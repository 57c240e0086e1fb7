"""``create_app(settings)``: the router's ASGI app; its lifespan owns every client.

The lifespan builds the upstream connection pool, the candidate sources (static
upstreams polled by URL, the registry when configured) and their refresh
loops, the GeoIP reader, and the routing parts; handlers reach them through
:class:`RouterState` on ``app.state``. Tests may pass ``candidates`` /
``traffic`` (the discovery seam).
"""

from __future__ import annotations

import contextlib
import gc
import random
from collections.abc import AsyncIterator, Callable, Mapping
from dataclasses import dataclass

from fastapi import FastAPI
from fastapi.exceptions import RequestValidationError
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from geo_router.auth import Authenticator, RateLimiter
from geo_router.catalog import CandidateSource, TrafficPoller, TrafficSource, open_discovery
from geo_router.classifier import DifficultyClassifier
from geo_router.completions import CompletionEndpoints
from geo_router.dispatch import Dispatcher
from geo_router.http_client import UpstreamPool
from geo_router.metrics import RouterMetrics
from geo_router.openapi import install_openapi
from geo_router.peers import PeerBook
from geo_router.planner import Planner
from geo_router.prefix_index import PrefixIndex
from geo_router.region import RegionResolver, open_geoip
from geo_router.routes import router as api_routes
from geo_router.scoring import Scorer
from geo_router.settings import RouterSettings
from geo_router.tracker import Tracker
from servekit.errors import InvalidRequest, ServeError, error_body

__all__ = ["RouterState", "create_app"]


@dataclass(slots=True)
class RouterState:
    """Everything a handler needs, built by the lifespan."""

    settings: RouterSettings
    auth: Authenticator
    limiter: RateLimiter
    resolver: RegionResolver
    classifier: DifficultyClassifier
    planner: Planner
    tracker: Tracker
    dispatcher: Dispatcher
    metrics: RouterMetrics
    stale: Callable[[], bool]  # discovery runs on a last-known catalog


def create_app(
    settings: RouterSettings,
    *,
    candidates: CandidateSource | None = None,
    traffic: TrafficSource | None = None,
    rng: random.Random | None = None,
) -> CompletionEndpoints:
    """Build the router. ``candidates``/``traffic`` replace discovery (tests, simulators).

    The returned ASGI app serves the completion endpoints itself and hands
    everything else (and the lifespan) to the FastAPI app at ``.app``.
    """
    metrics = RouterMetrics()

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        # The TTFT deadline is enforced per attempt by the dispatcher; the read
        # timeout bounds the gap between chunks once a stream flows.
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
            tracker = Tracker(settings.routing.breaker)
            scorer = Scorer(settings.routing, settings.region.rtt_table(), tracker, rng)
            classifier = DifficultyClassifier.load(
                settings.classifier.weights,
                settings.classifier.threshold,
                settings.classifier.max_chars,
            )
            cache = settings.routing.prefix_cache
            prefixes = (
                PrefixIndex(
                    block_chars=cache.block_chars, max_blocks=cache.max_blocks, ttl_s=cache.ttl_s
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
            )
            app.state.router = RouterState(
                settings=settings,
                auth=Authenticator(settings.auth),
                limiter=RateLimiter(),
                resolver=RegionResolver(settings.region, geo),
                classifier=classifier,
                planner=planner,
                tracker=tracker,
                dispatcher=Dispatcher(
                    client,
                    planner,
                    tracker,
                    metrics,
                    settings.routing,
                    prefixes,
                    peers.for_instance,
                ),
                metrics=metrics,
                stale=found.stale,
            )
            # Everything built so far (FastAPI, pydantic, the catalog) lives as
            # long as the process: keep it out of the collector's full passes,
            # whose cost grows with the whole heap and lands on whichever
            # requests are in flight at the time.
            gc.freeze()
            stack.callback(gc.unfreeze)
            yield

    app = FastAPI(title="hybrid-llm geo router", version="0.1.0", lifespan=lifespan)
    app.include_router(api_routes)
    app.add_exception_handler(ServeError, _serve_error)
    app.add_exception_handler(HTTPException, _http_error)
    app.add_exception_handler(RequestValidationError, _validation_error)
    install_openapi(app)
    return CompletionEndpoints(app)


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


async def _serve_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, ServeError)
    state = getattr(request.app.state, "router", None)
    if isinstance(state, RouterState) and exc.status < 500:
        state.metrics.rejected.labels(str(exc.status)).inc()
    return JSONResponse(exc.body(), status_code=exc.status, headers=exc.headers())


async def _http_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, HTTPException)
    kind = "not_found_error" if exc.status_code == 404 else "invalid_request_error"
    return JSONResponse(
        error_body(str(exc.detail), kind, None, None),
        status_code=exc.status_code,
        headers=dict(exc.headers or {}),
    )


async def _validation_error(request: Request, exc: Exception) -> Response:
    err = InvalidRequest(f"invalid request: {exc}")
    return JSONResponse(err.body(), status_code=400)
