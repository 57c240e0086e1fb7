"""Engines: the one seam between the services and whatever runs the model."""

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
