"""One place that renders every failure in the OpenAI error shape."""

from __future__ import annotations

import logging
from collections.abc import Callable

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from pydantic import ValidationError
from starlette.exceptions import HTTPException as StarletteHTTPException

from servekit.errors import InvalidRequest, ServeError, error_body
from servekit.wire import invalid_from_validation

__all__ = ["error_response", "install_error_handlers"]

log = logging.getLogger(__name__)

_HTTP_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    404: "not_found_error",
    405: "invalid_request_error",
    413: "invalid_request_error",
    415: "invalid_request_error",
    429: "rate_limit_error",
}


def error_response(exc: ServeError) -> JSONResponse:
    return JSONResponse(exc.body(), status_code=exc.status, headers=exc.headers())


def install_error_handlers(
    app: FastAPI, on_error: Callable[[ServeError], None] | None = None
) -> None:
    """Render every failure of ``app``'s routes in the OpenAI shape; ``on_error``
    (metrics) sees each :class:`ServeError` first."""

    async def on_serve_error(_: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, ServeError)
        if exc.status >= 500:
            log.warning("request failed: %r", exc)
        if on_error is not None:
            on_error(exc)
        return error_response(exc)

    async def on_validation(_: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, RequestValidationError)
        errors = exc.errors()
        if errors and errors[0].get("type") == "json_invalid":
            err = InvalidRequest("request body is not valid JSON", code="invalid_json")
        else:
            err = _from_fastapi_errors(errors)
        if on_error is not None:
            on_error(err)
        return error_response(err)

    async def on_http(_: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, StarletteHTTPException)
        body = error_body(str(exc.detail), _HTTP_TYPES.get(exc.status_code, "error"))
        return JSONResponse(body, status_code=exc.status_code, headers=exc.headers)

    async def on_unexpected(_: Request, exc: Exception) -> JSONResponse:
        log.exception("unhandled error", exc_info=exc)
        return JSONResponse(error_body("internal server error", "internal_error"), status_code=500)

    app.add_exception_handler(ServeError, on_serve_error)
    app.add_exception_handler(RequestValidationError, on_validation)
    app.add_exception_handler(StarletteHTTPException, on_http)
    app.add_exception_handler(Exception, on_unexpected)


def _from_fastapi_errors(errors: object) -> InvalidRequest:
    """FastAPI wraps pydantic's errors; rebuild them so parameters are named alike."""
    try:
        rebuilt = ValidationError.from_exception_data(
            "body",
            [
                {
                    "type": e["type"],
                    "loc": tuple(e["loc"]),
                    "input": e.get("input"),
                    "ctx": e.get("ctx") or {},
                }
                for e in errors  # type: ignore[attr-defined]
            ],
        )
        return invalid_from_validation(rebuilt)
    except (KeyError, TypeError, ValueError):
        return InvalidRequest("invalid request body")
