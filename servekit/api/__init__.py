"""The OpenAI HTTP serving layer, built from any :class:`~servekit.engine.Engine`.

The edge agent and the central gateway both serve through it: they build a
:class:`ServingCore` (engine source, admission queue, metrics) in their
lifespan, store it on ``app.state.core``, and get the same routes, streaming,
error handling and operational endpoints.
"""

from servekit.api.core import EngineSource, FixedEngine, ServingCore
from servekit.api.routes import build_serving_app, get_core

__all__ = ["EngineSource", "FixedEngine", "ServingCore", "build_serving_app", "get_core"]
