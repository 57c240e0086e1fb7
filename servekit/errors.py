"""The project's error tree, and its one rendering in the OpenAI error shape.

Every service raises these; one handler per app turns them into
``{"error": {"message", "type", "param", "code"}}`` with the right status.
Foreign exceptions (httpx, llama.cpp, Consul) are translated into this tree
at exactly one boundary per foreign library.

    ServeError                      500 internal_error
    ├── InvalidRequest              400 invalid_request_error
    │   └── ContextLengthExceeded   400 code=context_length_exceeded
    ├── AuthenticationFailed        401 authentication_error
    ├── ModelNotFound               404 code=model_not_found
    ├── NotFound                    404 (an unknown id, such as a response id)
    ├── Conflict                    409 (the resource's state forbids it: already rated)
    ├── PayloadTooLarge             413
    ├── RateLimited                 429 (Retry-After)
    │   └── QueueFull               429 (Retry-After)
    ├── NotReady                    503 (Retry-After)
    ├── UpstreamError               502 (the upstream failed: 5xx, bad body, broke off)
    │   ├── UpstreamUnavailable     503 (could not connect: nothing was sent)
    │   ├── UpstreamTimeout         504
    │   ├── UpstreamRejected        502 (a 400 that may be the engine's own failure)
    │   └── LoadNotReported         502 (answered without a load: servekit.load_reading)
    ├── StreamDeadlineExceeded      504 (the answer ran past its total time; sent as an event)
    └── EngineFailure               500 (the local engine crashed)
"""

from __future__ import annotations

import email.utils
import time
from typing import Any, ClassVar, Literal

__all__ = [
    "AuthenticationFailed",
    "Conflict",
    "ContextLengthExceeded",
    "EngineFailure",
    "InvalidRequest",
    "ModelNotFound",
    "NotFound",
    "NotReady",
    "PayloadTooLarge",
    "QueueFull",
    "RateLimited",
    "ServeError",
    "StreamDeadlineExceeded",
    "UpstreamError",
    "UpstreamRejected",
    "UpstreamTimeout",
    "UpstreamUnavailable",
    "error_body",
    "error_from_body",
    "parse_retry_after",
    "upstream_failure",
]


class ServeError(Exception):
    """Base of every error a service reports to a client."""

    status: ClassVar[int] = 500
    type: ClassVar[str] = "internal_error"
    default_code: ClassVar[str | None] = None

    def __init__(
        self,
        message: str,
        *,
        param: str | None = None,
        code: str | None = None,
        retry_after: float | None = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.param = param
        self.code = code if code is not None else self.default_code
        self.retry_after = retry_after

    @property
    def retryable(self) -> bool:
        """Whether another instance could answer the same request."""
        return self.status >= 500 or self.status == 429

    def body(self) -> dict[str, Any]:
        return error_body(self.message, self.type, self.param, self.code)

    def headers(self) -> dict[str, str]:
        if self.retry_after is None:
            return {}
        return {"Retry-After": str(max(1, round(self.retry_after)))}

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.message!r}, status={self.status})"


class InvalidRequest(ServeError):
    status = 400
    type = "invalid_request_error"


class ContextLengthExceeded(InvalidRequest):
    default_code = "context_length_exceeded"


class AuthenticationFailed(ServeError):
    status = 401
    type = "authentication_error"
    default_code = "invalid_api_key"


class PermissionDenied(ServeError):
    status = 403
    type = "permission_error"
    default_code = "permission_denied"


class ModelNotFound(ServeError):
    status = 404
    type = "invalid_request_error"
    default_code = "model_not_found"


class NotFound(ServeError):
    status = 404
    type = "invalid_request_error"
    default_code = "not_found"


class Conflict(ServeError):
    status = 409
    type = "invalid_request_error"
    default_code = "conflict"


class PayloadTooLarge(ServeError):
    status = 413
    type = "invalid_request_error"
    default_code = "request_too_large"


class RateLimited(ServeError):
    status = 429
    type = "rate_limit_error"
    default_code = "rate_limit_exceeded"


class QueueFull(RateLimited):
    default_code = "queue_full"


class NotReady(ServeError):
    status = 503
    type = "service_unavailable"
    default_code = "not_ready"


class UpstreamError(ServeError):
    status = 502
    type = "upstream_error"


class UpstreamUnavailable(UpstreamError):
    status = 503
    type = "service_unavailable"
    default_code = "upstream_unavailable"


class UpstreamTimeout(UpstreamError):
    status = 504
    type = "timeout"
    default_code = "upstream_timeout"


class UpstreamRejected(UpstreamError):
    """A 400 from an upstream that answers its own failures with 400 as well.

    ``trtllm-serve`` turns every exception in its handlers into a 400
    ``BadRequestError``, so one refusal does not say whether the request or
    the engine is at fault. It is retryable on another instance; when every
    instance refused it, the request is to blame and :attr:`rejection` (the
    upstream's 400) is what the client gets.
    """

    default_code = "upstream_rejected"

    def __init__(self, rejection: ServeError) -> None:
        super().__init__(f"upstream refused the request: {rejection.message}")
        self.rejection = rejection


class StreamDeadlineExceeded(ServeError):
    """An answer still running at its deadline (``server.stream_deadline_s``): the stream
    ends with this as its error event and ``[DONE]`` (:mod:`servekit.stream_deadline`)."""

    status = 504
    type = "timeout"
    default_code = "stream_deadline_exceeded"


class EngineFailure(ServeError):
    status = 500
    type = "internal_error"
    default_code = "engine_failure"


def error_body(
    message: str, type_: str, param: str | None = None, code: str | None = None
) -> dict[str, Any]:
    return {"error": {"message": message, "type": type_, "param": param, "code": code}}


_BY_STATUS: dict[int, type[ServeError]] = {
    400: InvalidRequest,
    401: AuthenticationFailed,
    404: ModelNotFound,
    413: PayloadTooLarge,
    429: RateLimited,
    503: UpstreamUnavailable,
    504: UpstreamTimeout,
}


def error_from_body(status: int, body: Any, *, retry_after: float | None = None) -> ServeError:
    """Rebuild a project error from an upstream's OpenAI-shaped error response.

    Client errors keep their status (the request itself is at fault and no
    other instance would accept it); anything 5xx becomes an upstream error.
    Besides the OpenAI shape it reads the flat ``{"object": "error", "message",
    "type", "code": 400}`` that trtllm-serve's ``ErrorResponse`` sends, its
    ``{"error": "..."}`` for validation errors, and FastAPI's ``{"detail": ...}``.
    """
    message = f"upstream returned HTTP {status}"
    param: str | None = None
    code: str | None = None
    err: Any = body.get("error") if isinstance(body, dict) else None
    if isinstance(body, dict) and not isinstance(err, dict) and "message" in body:
        err = body  # flat: trtllm-serve's ErrorResponse
    if isinstance(err, dict):
        message = str(err.get("message") or message)
        param = err.get("param") if isinstance(err.get("param"), str) else None
        code = err.get("code") if isinstance(err.get("code"), str) else None
    elif isinstance(err, str) and err:
        message = err
    elif isinstance(body, dict) and isinstance(body.get("detail"), str):
        message = body["detail"]
    if code == "context_length_exceeded":
        return ContextLengthExceeded(message, param=param, retry_after=retry_after)
    if code == "queue_full":
        return QueueFull(message, retry_after=retry_after)
    cls = _BY_STATUS.get(status)
    if cls is None:
        cls = InvalidRequest if 400 <= status < 500 else UpstreamError
    return cls(message, param=param, code=code, retry_after=retry_after)


def parse_retry_after(value: str | None, now: float | None = None) -> float | None:
    """Seconds from a ``Retry-After`` header: delta-seconds or an HTTP-date (RFC 9110)."""
    if value is None:
        return None
    value = value.strip()
    try:
        seconds = float(value)
    except ValueError:
        try:
            when = email.utils.parsedate_to_datetime(value)
        except (TypeError, ValueError):
            return None
        seconds = when.timestamp() - (time.time() if now is None else now)
    return max(0.0, seconds) if seconds == seconds else None  # NaN: no hint


UpstreamFailure = Literal["connect", "timeout", "broken"]


def upstream_failure(how: UpstreamFailure, where: str, detail: str) -> UpstreamError:
    """The one mapping of a failed upstream exchange onto the tree, for every client.

    ``connect``: no connection (refused, unreachable, TLS refused), so nothing
    was sent: 503, safe to send anywhere. ``timeout``: 504. ``broken``: the
    connection closed or turned malformed after the request went out, so the
    upstream took it and failed: 502 ``upstream_disconnected``. All three are
    retryable, so the router and the central pool fail over alike.
    """
    if how == "connect":
        return UpstreamUnavailable(f"cannot connect to upstream {where}: {detail}")
    if how == "timeout":
        return UpstreamTimeout(f"upstream {where} timed out: {detail}")
    return UpstreamError(
        f"connection to upstream {where} broke: {detail}", code="upstream_disconnected"
    )
