"""The OpenAI HTTP serving layer and the service kit every service is composed with.

:func:`create_service_app` builds the app of the router, the edge agent and
the central gateway alike; :func:`build_serving_app` is it over an engine:
the edge agent and the central gateway build a :class:`ServingCore` (engine
source, admission queue, metrics) in their lifespan, store it on
``app.state.core``, and get the same routes, streaming, error handling and
operational endpoints.
"""

from servekit.api.core import EngineSource, FixedEngine, ServingCore
from servekit.api.ops import CoreOps, ServiceOps
from servekit.api.routes import build_serving_app, get_core
from servekit.api.service import create_service_app

__all__ = [
    "CoreOps",
    "EngineSource",
    "FixedEngine",
    "ServiceOps",
    "ServingCore",
    "build_serving_app",
    "create_service_app",
    "get_core",
]
