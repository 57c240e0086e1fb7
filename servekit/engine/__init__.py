"""Engines: the one seam between the services and whatever runs the model."""

import os

# llama.cpp's CPU backend runs its threads on OpenMP (libgomp). After each
# decode libgomp keeps its idle threads spinning for GOMP_SPINCOUNT pause loops
# (default 300000: milliseconds) before they sleep, holding a core that the
# event loop needs to send the token just made; on 2 cores the agent's
# first-token hand-off had a 3 ms p90 tail from it. 10000 keeps the spin short
# (decode speed unchanged: barriers inside a decode are far shorter). It must be
# set before libgomp loads, i.e. before anything imports llama_cpp, which only
# modules of this package do. An operator's own setting wins.
os.environ.setdefault("GOMP_SPINCOUNT", "10000")

from servekit.engine.protocol import (
    Engine,
    Finish,
    GenerationEvent,
    GenerationRequest,
    LoadReport,
    Message,
    Priority,
    SamplingParams,
    TextDelta,
)

__all__ = [
    "Engine",
    "Finish",
    "GenerationEvent",
    "GenerationRequest",
    "LoadReport",
    "Message",
    "Priority",
    "SamplingParams",
    "TextDelta",
]
