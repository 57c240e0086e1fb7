from __future__ import annotations

import pytest

from servekit.errors import (
    ContextLengthExceeded,
    InvalidRequest,
    ModelNotFound,
    QueueFull,
    RateLimited,
    UpstreamError,
    UpstreamTimeout,
    UpstreamUnavailable,
    error_from_body,
    parse_retry_after,
    upstream_failure,
)


def test_body_and_retry_after() -> None:
    err = QueueFull("busy", retry_after=2.4)
    assert err.status == 429
    assert err.headers() == {"Retry-After": "2"}
    assert err.body() == {
        "error": {
            "message": "busy",
            "type": "rate_limit_error",
            "param": None,
            "code": "queue_full",
        }
    }
    assert QueueFull("x", retry_after=0.1).headers() == {"Retry-After": "1"}


@pytest.mark.parametrize(
    ("status", "body", "cls"),
    [
        (400, {"error": {"message": "bad", "param": "x"}}, InvalidRequest),
        (
            400,
            {"error": {"message": "long", "code": "context_length_exceeded"}},
            ContextLengthExceeded,
        ),
        (404, {"error": {"message": "no"}}, ModelNotFound),
        (429, {"error": {"message": "slow down"}}, RateLimited),
        (429, {"error": {"message": "full", "code": "queue_full"}}, QueueFull),
        (500, {"detail": "boom"}, UpstreamError),
        (503, None, UpstreamUnavailable),
        (504, "not json", UpstreamTimeout),
        (418, {}, InvalidRequest),
    ],
)
def test_error_from_upstream_body(status: int, body: object, cls: type) -> None:
    err = error_from_body(status, body, retry_after=3)
    assert type(err) is cls
    assert err.retry_after == 3


def test_retryable() -> None:
    assert UpstreamError("x").retryable
    assert QueueFull("x").retryable
    assert not InvalidRequest("x").retryable


def test_retry_after_reads_seconds_and_http_dates() -> None:
    assert parse_retry_after("7") == 7.0
    assert parse_retry_after(" 1.5 ") == 1.5
    assert parse_retry_after("-3") == 0.0
    now = 784111777.0  # Sun, 06 Nov 1994 08:49:37 GMT
    assert parse_retry_after("Sun, 06 Nov 1994 08:49:57 GMT", now=now) == 20.0
    assert parse_retry_after("soon") is None
    assert parse_retry_after(None) is None


def test_one_mapping_of_upstream_failures() -> None:
    assert upstream_failure("connect", "u", "refused").status == 503
    assert upstream_failure("timeout", "u", "slow").status == 504
    broken = upstream_failure("broken", "u", "reset")
    assert (broken.status, broken.code, broken.retryable) == (502, "upstream_disconnected", True)
