"""The OpenAI-compatible routes and the operational endpoints of a serving instance."""

from __future__ import annotations

import time
from typing import Annotated, Any, cast

from fastapi import APIRouter, Depends, FastAPI, Request
from fastapi.responses import JSONResponse, PlainTextResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from servekit.api.core import ServingCore
from servekit.api.errors import error_response, install_error_handlers
from servekit.api.generation import run_generation
from servekit.api.limits import ARRIVAL_KEY, RequestLimits
from servekit.api.openapi import ERROR_SCHEMA, SSE_EVENT_SCHEMA
from servekit.engine.protocol import GenerationRequest, Priority
from servekit.errors import NotReady
from servekit.wire import (
    ChatCompletion,
    ChatCompletionRequest,
    Completion,
    CompletionRequest,
    ModelCard,
    ModelList,
    new_id,
)

__all__ = ["build_serving_app", "get_core"]


def get_core(request: Request) -> ServingCore:
    core = getattr(request.app.state, "core", None)
    if core is None:
        raise NotReady("service is starting", retry_after=1)
    return cast(ServingCore, core)


CoreDep = Annotated[ServingCore, Depends(get_core)]


def _error(description: str) -> dict[str, Any]:
    return {"description": description, "content": {"application/json": {"schema": ERROR_SCHEMA}}}


def _generation_responses(model: type[Any]) -> dict[int | str, dict[str, Any]]:
    return {
        200: {
            "description": "A completion, or a stream of chunks when `stream` is true.",
            "model": model,
            "content": {"text/event-stream": {"schema": SSE_EVENT_SCHEMA}},
        },
        400: _error("Invalid request (bad parameter, prompt longer than the context)."),
        404: _error("Unknown model."),
        413: _error("Request body too large."),
        429: _error("Queue full or rate limited; see Retry-After."),
        500: _error("The engine failed."),
        503: _error("Not ready, draining, or upstream unavailable; see Retry-After."),
        504: _error("Upstream timed out."),
    }


def _arrival(request: Request) -> float:
    return cast(float, request.scope.get(ARRIVAL_KEY) or time.perf_counter())


def _priority(request: Request) -> Priority:
    return Priority.parse(request.headers.get("x-priority"))


def openai_router() -> APIRouter:
    router = APIRouter()

    @router.post(
        "/v1/chat/completions",
        response_model=None,
        responses=_generation_responses(ChatCompletion),
        summary="Create a chat completion",
    )
    async def chat_completions(
        body: ChatCompletionRequest, request: Request, core: CoreDep
    ) -> Response:
        arrival = _arrival(request)
        core.check_model(body.model)
        core.check_token_limits(
            max_tokens=body.max_tokens, max_completion_tokens=body.max_completion_tokens
        )
        rid = request.headers.get("x-request-id") or new_id("chatcmpl")
        gen = GenerationRequest.from_chat(body, rid, _priority(request))
        return await run_generation(
            core, request, gen, stream=body.stream, include_usage=body.include_usage(),
            arrival=arrival,
        )  # fmt: skip

    @router.post(
        "/v1/completions",
        response_model=None,
        responses=_generation_responses(Completion),
        summary="Create a text completion",
    )
    async def completions(body: CompletionRequest, request: Request, core: CoreDep) -> Response:
        arrival = _arrival(request)
        core.check_model(body.model)
        core.check_token_limits(max_tokens=body.max_tokens)
        rid = request.headers.get("x-request-id") or new_id("cmpl")
        gen = GenerationRequest.from_completion(body, rid, _priority(request))
        return await run_generation(
            core, request, gen, stream=body.stream, include_usage=body.include_usage(),
            arrival=arrival,
        )  # fmt: skip

    @router.get("/v1/models", response_model=ModelList, summary="List served models")
    async def models(core: CoreDep) -> ModelList:
        return ModelList(data=[ModelCard(id=name) for name in core.model_names()])

    return router


def ops_router() -> APIRouter:
    router = APIRouter()

    @router.get("/health", summary="Liveness")
    async def health() -> dict[str, str]:
        return {"status": "ok"}

    @router.get(
        "/ready",
        summary="Readiness: 503 while loading, warming or draining",
        responses={503: _error("Not ready.")},
    )
    async def ready(request: Request) -> Response:
        core = getattr(request.app.state, "core", None)
        if core is not None and await cast(ServingCore, core).ready():
            return JSONResponse({"status": "ready"})
        state = "draining" if core is not None and core.draining else "loading"
        return error_response(NotReady(f"not ready: {state}", retry_after=1))

    @router.get("/load", summary="Load report carried by registry heartbeats")
    async def load(core: CoreDep) -> dict[str, Any]:
        return core.load().to_dict()

    @router.get("/metrics", summary="Prometheus metrics", response_class=PlainTextResponse)
    async def metrics(core: CoreDep) -> Response:
        return Response(generate_latest(core.metrics.registry), media_type=CONTENT_TYPE_LATEST)

    return router


def _document(app: FastAPI, model: str, max_tokens_limit: int | None) -> None:
    """Document a working request per endpoint, naming the model actually served,
    and the largest ``max_tokens`` the context window allows."""
    examples = {
        "/v1/chat/completions": {
            "model": model, "max_tokens": 8, "temperature": 0,
            "messages": [{"role": "user", "content": "Say hello."}],
        },
        "/v1/completions": {"model": model, "prompt": "Once upon a time", "max_tokens": 8},
    }  # fmt: skip
    build = app.openapi

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            schema = build()
            for path, example in examples.items():
                content = schema["paths"][path]["post"]["requestBody"]["content"]
                content["application/json"]["example"] = example
            if max_tokens_limit is not None:
                for name in ("ChatCompletionRequest", "CompletionRequest"):
                    props = schema["components"]["schemas"][name]["properties"]
                    for field in ("max_tokens", "max_completion_tokens"):
                        for branch in props.get(field, {}).get("anyOf", []):
                            if branch.get("type") == "integer":
                                branch["maximum"] = max_tokens_limit
            app.openapi_schema = schema
        return app.openapi_schema

    app.openapi = openapi  # type: ignore[method-assign]


def build_serving_app(
    *,
    title: str,
    version: str,
    lifespan: Any,
    max_body_bytes: int = 1 << 20,
    example_model: str | None = None,
    max_tokens_limit: int | None = None,
) -> FastAPI:
    """A FastAPI app with the OpenAI and ops routes; ``lifespan`` sets ``app.state.core``."""
    app = FastAPI(title=title, version=version, lifespan=lifespan)
    install_error_handlers(app)
    app.include_router(openai_router())
    app.include_router(ops_router())
    app.add_middleware(RequestLimits, max_body_bytes=max_body_bytes)
    if example_model is not None:
        _document(app, example_model, max_tokens_limit)
    return app
