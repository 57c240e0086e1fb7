"""A routed request as it was accepted, and the one body each upstream gets from it.

:class:`RouteRequest` is immutable: a mid-stream continuation is a *new*
request (:func:`continued`), the original extended by the partial answer
the client already has, and it is re-planned like any request, so window
fit, trimming and prefix are judged on what will actually be sent.
:func:`upstream_body` is the only place an upstream body is built: the
candidate's model name, its trimmed messages (computed by the planner from
this request's messages, a continuation's partial assistant turn included),
always streamed, with its tenant's ``cache_salt``.

The continuation rule itself (the partial answer ends the prompt, the token
budget shrinks) is ``servekit.continuation``'s, shared with the central gateway.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from geo_router.continuation import Kind, Partial
from geo_router.region import ResolvedRegion
from geo_router.scoring import Scored
from servekit.continuation import continued_messages, continued_prompt, tokens_left

if TYPE_CHECKING:
    from opentelemetry.trace import Span

__all__ = ["RouteRequest", "continued", "upstream_body"]


@dataclass(frozen=True, slots=True)
class RouteRequest:
    body: dict[str, Any]  # the validated client body (a continuation's: extended)
    kind: Kind
    path: str
    region: ResolvedRegion
    sticky: str
    headers: dict[str, str]  # sent upstream (priority, request id)
    arrived: float  # perf_counter at arrival
    tenant: str | None = None  # its API key's tenant (trimming and routing policy per tenant)
    use_case: str | None = None  # X-Use-Case (the routing policy's latency/quality class)
    span: Span | None = None  # its trace's request span (tracing on): attempts are children
    cache_salt: str | None = None  # its tenant's cache scope, sent upstream as cache_salt


def upstream_body(req: RouteRequest, cand: Scored) -> bytes:
    """``req``'s body as ``cand`` gets it: its model name, its trimmed messages, streamed
    with usage, and its tenant's ``cache_salt`` (engines reuse cached prefixes only
    within one)."""
    out = dict(req.body)
    out["model"] = cand.state.info.model
    if req.cache_salt is not None:
        out["cache_salt"] = req.cache_salt
    if cand.trim is not None and "messages" in out:
        out["messages"] = cand.trim.apply(out["messages"])
    out["stream"] = True
    # Always: a non-streamed answer is built from it, and the token limit settles from it;
    # a streaming client that did not ask never sees it (geo_router.completions).
    out["stream_options"] = {"include_usage": True}
    return json.dumps(out, ensure_ascii=False, separators=(",", ":")).encode()


def continued(req: RouteRequest, partial: Partial) -> RouteRequest | None:
    """``req`` going on after ``partial``; ``None`` when its token budget is spent."""
    body = dict(req.body)
    for key in ("max_completion_tokens", "max_tokens"):
        limit = body.get(key)
        if isinstance(limit, int) and not isinstance(limit, bool):
            left = tokens_left(limit, partial.tokens)
            if left == 0:
                return None
            body[key] = left
    if partial.text:  # else nothing reached the client yet: a plain retry
        if req.kind == "chat":
            continuing = body.get("continue_final_message") is True
            body["messages"] = continued_messages(
                body["messages"], partial.text, continuing=continuing
            )
            body["continue_final_message"] = True
            body["add_generation_prompt"] = False
        else:
            body["prompt"] = continued_prompt(body["prompt"], partial.text)
    return replace(req, body=body)
