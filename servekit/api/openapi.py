"""OpenAPI fragments every OpenAI-compatible service documents the same way."""

from __future__ import annotations

from typing import Any

__all__ = ["ERROR_SCHEMA", "SSE_EVENT_SCHEMA"]

# The OpenAI error shape, {"error": {"message", "type", "param", "code"}}.
ERROR_SCHEMA: dict[str, Any] = {
    "type": "object",
    "required": ["error"],
    "properties": {
        "error": {
            "type": "object",
            "required": ["message", "type"],
            "properties": {
                "message": {"type": "string"},
                "type": {"type": "string"},
                "param": {"type": ["string", "null"]},
                "code": {"type": ["string", "null"]},
            },
        }
    },
}

# Each server-sent event: a `data:` line holding one JSON chunk, or [DONE].
SSE_EVENT_SCHEMA: dict[str, Any] = {
    "type": "object",
    "required": ["data"],
    "properties": {"data": {"type": "string"}},
}
