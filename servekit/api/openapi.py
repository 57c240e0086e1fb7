"""OpenAPI fragments every OpenAI-compatible service documents the same way."""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI
from fastapi.openapi.utils import get_openapi
from pydantic import BaseModel
from pydantic.json_schema import JsonSchemaMode

from servekit.wire import ChatCompletion, ChatCompletionRequest, Completion, CompletionRequest

__all__ = ["ERROR_SCHEMA", "SSE_EVENT_SCHEMA", "document_completions", "error_doc"]

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


_REF = "#/components/schemas/{model}"


def error_doc(description: str) -> dict[str, Any]:
    return {"description": description, "content": {"application/json": {"schema": ERROR_SCHEMA}}}


def _schema(
    schemas: dict[str, Any], model: type[BaseModel], mode: JsonSchemaMode
) -> dict[str, str]:
    """Add ``model``'s JSON schema (and its definitions) to ``schemas``; a reference to it."""
    schema = model.model_json_schema(ref_template=_REF, mode=mode)
    schemas.update(schema.pop("$defs", {}))
    schemas[model.__name__] = schema
    return {"$ref": _REF.format(model=model.__name__)}


def _operation(
    schemas: dict[str, Any],
    request: type[BaseModel],
    response: type[BaseModel],
    summary: str,
    example: dict[str, Any],
) -> dict[str, Any]:
    return {
        "summary": summary,
        "operationId": summary.lower().replace(" ", "_"),
        "requestBody": {
            "required": True,
            "content": {
                "application/json": {
                    "schema": _schema(schemas, request, "validation"),
                    "example": example,
                }
            },
        },
        "responses": {
            "200": {
                "description": "A completion, or a stream of chunks when `stream` is true.",
                "content": {
                    "application/json": {"schema": _schema(schemas, response, "serialization")},
                    "text/event-stream": {"schema": SSE_EVENT_SCHEMA},
                },
            },
            "400": error_doc("Invalid request (bad parameter, prompt longer than the context)."),
            "401": error_doc("No or wrong service token (when the service requires one)."),
            "404": error_doc("Unknown model."),
            "413": error_doc("Request body too large."),
            "429": error_doc("Queue full or rate limited; see Retry-After."),
            "500": error_doc("The engine failed."),
            "503": error_doc("Not ready, draining, or upstream unavailable; see Retry-After."),
            "504": error_doc("Upstream timed out."),
        },
    }


def document_completions(
    app: FastAPI, example_model: str | None, max_tokens_limit: int | None
) -> None:
    """Describe the plain-ASGI completion endpoints in ``app``'s OpenAPI document.

    Request and response schemas come from the wire types; the examples name
    the model actually served, and ``max_tokens`` is bounded by the context.
    """
    model = example_model or "default"
    examples = {
        "chat": {
            "model": model, "max_tokens": 8, "temperature": 0,
            "messages": [{"role": "user", "content": "Say hello."}],
        },
        "completion": {"model": model, "prompt": "Once upon a time", "max_tokens": 8},
    }  # fmt: skip

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is not None:
            return app.openapi_schema
        doc = get_openapi(title=app.title, version=app.version, routes=app.routes)
        schemas = doc.setdefault("components", {}).setdefault("schemas", {})
        paths = doc.setdefault("paths", {})
        paths["/v1/chat/completions"] = {
            "post": _operation(
                schemas, ChatCompletionRequest, ChatCompletion,
                "Create a chat completion", examples["chat"],
            )
        }  # fmt: skip
        paths["/v1/completions"] = {
            "post": _operation(
                schemas, CompletionRequest, Completion,
                "Create a text completion", examples["completion"],
            )
        }  # fmt: skip
        if max_tokens_limit is not None:
            for name in ("ChatCompletionRequest", "CompletionRequest"):
                props = schemas[name]["properties"]
                for field in ("max_tokens", "max_completion_tokens"):
                    for branch in props.get(field, {}).get("anyOf", []):
                        if branch.get("type") == "integer":
                            branch["maximum"] = max_tokens_limit
        app.openapi_schema = doc
        return doc

    app.openapi = openapi  # type: ignore[method-assign]
