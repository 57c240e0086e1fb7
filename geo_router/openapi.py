"""The router's OpenAPI document: request schemas from the wire types, error shapes.

Handlers read raw bodies (so the size limit applies before parsing and the
client's fields are forwarded untouched), and the completion endpoints are
plain ASGI, so their request schemas and paths are added here from
:mod:`servekit.wire` rather than inferred by FastAPI.
"""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI
from fastapi.openapi.utils import get_openapi

from servekit.api.openapi import ERROR_SCHEMA
from servekit.wire import ChatCompletionRequest, CompletionRequest, closed_schema

__all__ = ["ERROR_RESPONSES", "STREAM_RESPONSES", "install_openapi", "request_body"]

_REF = "#/components/schemas/{model}"

_ERROR_CONTENT = {"application/json": {"schema": {"$ref": _REF.format(model="ErrorResponse")}}}

ERROR_RESPONSES: dict[int | str, dict[str, Any]] = {
    status: {"description": text, "content": _ERROR_CONTENT}
    for status, text in (
        (400, "Invalid request"),
        (401, "Missing or invalid API key"),
        (404, "Unknown model"),
        (413, "Request body too large"),
        (429, "Rate limited (see Retry-After)"),
        (502, "Upstream failed"),
        (503, "No healthy upstream"),
        (504, "Upstream timed out"),
    )
}

STREAM_RESPONSES: dict[int | str, dict[str, Any]] = {
    200: {
        "description": "A completion, or an SSE stream of chunks when stream=true",
        "content": {
            "application/json": {"schema": {"type": "object"}},
            "text/event-stream": {"schema": {"type": "string"}},
        },
    }
}


def request_body(model: str) -> dict[str, Any]:
    return {
        "requestBody": {
            "required": True,
            "content": {"application/json": {"schema": {"$ref": _REF.format(model=model)}}},
        }
    }


def install_openapi(app: FastAPI) -> None:
    def openapi() -> dict[str, Any]:
        if app.openapi_schema is not None:
            return app.openapi_schema
        doc = get_openapi(title=app.title, version=app.version, routes=app.routes)
        schemas = doc.setdefault("components", {}).setdefault("schemas", {})
        for model in (ChatCompletionRequest, CompletionRequest):
            schema = closed_schema(model.model_json_schema(ref_template=_REF))
            schemas.update(schema.pop("$defs", {}))
            schemas[model.__name__] = schema
        # The wire type rejects echo=true (unsupported); say so in the schema.
        schemas["CompletionRequest"]["properties"]["echo"] = {"type": "boolean", "enum": [False]}
        schemas["ErrorResponse"] = ERROR_SCHEMA
        doc["components"]["securitySchemes"] = {"bearer": {"type": "http", "scheme": "bearer"}}
        paths = doc.setdefault("paths", {})
        for path, name, summary in (
            ("/v1/chat/completions", "ChatCompletionRequest", "Create a chat completion"),
            ("/v1/completions", "CompletionRequest", "Create a text completion"),
        ):
            responses = {str(k): v for k, v in {**STREAM_RESPONSES, **ERROR_RESPONSES}.items()}
            paths[path] = {
                "post": {
                    "summary": summary + ", routed to the edge or the center",
                    "operationId": path.strip("/").replace("/", "_"),
                    "tags": ["openai"],
                    **request_body(name),
                    "responses": responses,
                }
            }
        for path, item in paths.items():
            if path.startswith("/v1/"):
                for operation in item.values():
                    operation["security"] = [{"bearer": []}]
        app.openapi_schema = doc
        return doc

    app.openapi = openapi  # type: ignore[method-assign]
