"""Where TTFT goes, read back from the traces, beside the TTFT the client measured.

    scripts/setup.sh --phoenix
    hybrid-llm up --tracing --netem --detach
    python -m studies.trace_stages --requests 36 --concurrency 2 --continued 2
    hybrid-llm down

Sends the realistic conversation workload (``hybrid-llm bench``'s default
mix: customer service, multi-turn chat, the labelled simple/hard set, long
documents) through the router, streaming, each request with a
``traceparent`` of a fresh trace id. Then reads every trace back from the
topology's Phoenix (``hybrid_llm.local.trace_store``) and cuts the client's
TTFT at the span boundaries, which telescope, so the stages add up to it:

==================  ==========================================================
client→router       client send → ``router.request`` starts (connect, HTTP read)
intake              → ``router.region`` ends (auth, body, limit, region)
classify+plan       → ``router.plan`` ends
dispatch            → the winning ``router.attempt`` starts (a hedge: its delay)
hop out             → the instance's ``serve.request`` starts (pool, netem, HTTP)
instance intake     → ``serve.queue`` starts (body, template, tokens)
queue               ``serve.queue`` (admission wait)
prefill             ``serve.prefill`` (admission → the engine's first token)
hop back            → the attempt's ``first_token`` event (SSE back, netem)
router→client       → the client's first token (the router's write, the read)
==================  ==========================================================

The spans cover ``router.request``'s start to the attempt's first token; the
two client-side stages are what no span covers (the *gap*). Classes, by the
router's own spans: *continued* (``route.continuations`` > 0), *hedged* (an
attempt with ``attempt.hedge``), *failover* (several attempts, no hedge),
then by ``route.reason``: *same-city simple* (``simple``: an edge in the
user's region), *hard-to-center* (``hard``), else ``other (reason)``.
Means per class (means add up; medians do not), then the client TTFT P50.

Nothing breaks mid-stream on its own, so ``--continued N`` then forces N
continuations, one at a time: a long answer streams from a simple request,
and once its first token is in, the instance serving it (found by its
``X-Route-Instance`` in the topology's state file) is stopped (SIGSTOP,
whole process group); the router's idle timeout gives up on it and continues
the answer elsewhere; at the answer's end the instance is resumed (SIGCONT),
notices its caller left and exports its spans too. Each such trace is listed
span by span: both attempts, both instances' ``serve.request``, one trace id.
Clocks: spans are epoch times from each process's ``perf_counter`` offset
and the client's are ``time.time()``, one machine: skew is sub-millisecond.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import statistics
import time
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import httpx

from hybrid_llm.bench.client import RequestRecord, send_streaming
from hybrid_llm.bench.conversations import ConversationWorkload, builtin_workload
from hybrid_llm.bench.stats import percentile
from hybrid_llm.local.runstate import STATE_FILE, read_state
from hybrid_llm.local.trace_store import StoredSpan, fetch_trace

STAGES = (
    "client→router",
    "intake",
    "classify+plan",
    "dispatch",
    "hop out",
    "instance intake",
    "queue",
    "prefill",
    "hop back",
    "router→client",
)
CLASSES = ("same-city simple", "hard-to-center", "hedged", "continued", "failover")


@dataclass
class Sent:
    trace_id: str
    sent: float  # epoch seconds, just before the request went out
    record: RequestRecord
    served: int = 1  # `serve.request` spans its trace has once complete (one per instance)


async def _drive(
    router: str, key: str, workload: ConversationWorkload, total: int, concurrency: int
) -> list[Sent]:
    done: list[Sent] = []
    budget = [total]
    offset = time.time() - time.perf_counter()  # perf_counter → epoch
    run_start = time.perf_counter()

    async def worker(client: httpx.AsyncClient) -> None:
        while budget[0] > 0:
            conv = workload.conversation()
            messages = list(conv.prefix)
            for turn, text in enumerate(conv.turns):
                if budget[0] <= 0:
                    return
                budget[0] -= 1
                messages.append({"role": "user", "content": text})
                trace_id = os.urandom(16).hex()
                headers = {"traceparent": f"00-{trace_id}-{os.urandom(8).hex()}-01"}
                answer: list[str] = []
                body = workload.request_body(messages, conv.max_tokens)
                record = await send_streaming(
                    client,
                    workload.path,
                    body,
                    bucket=conv.label,
                    run_start=run_start,
                    headers=headers,
                    answer=answer,
                    turn=turn,
                )
                done.append(Sent(trace_id, run_start + record.start + offset, record))
                if not record.ok:
                    break
                messages.append({"role": "assistant", "content": "".join(answer)})

    auth = {"Authorization": f"Bearer {key}"}
    async with httpx.AsyncClient(base_url=router, headers=auth, timeout=120) as client:
        await asyncio.gather(*(worker(client) for _ in range(concurrency)))
    return done


LONG_ANSWER = "Count from 1 to 300, separated by commas."


def _process_group(state_dir: Path, service: str) -> int:
    """The process group of the topology's ``service`` (its state file's pid leads it)."""
    state = read_state(state_dir / STATE_FILE) or {}
    for child in state.get("children") or []:
        if child.get("name") == service and isinstance(child.get("pid"), int):
            return int(child["pid"])
    raise SystemExit(f"no running service {service!r} in {state_dir / STATE_FILE}")


async def _continued_once(client: httpx.AsyncClient, state_dir: Path, stop_after_s: float) -> Sent:
    """One streamed answer whose instance is stopped after its first token."""
    trace_id = os.urandom(16).hex()
    headers = {"traceparent": f"00-{trace_id}-{os.urandom(8).hex()}-01"}
    body = {"model": "auto", "stream": True, "max_tokens": 256, "temperature": 0}
    body["messages"] = [{"role": "user", "content": LONG_ANSWER}]
    sent, t0 = time.time(), time.perf_counter()
    record = RequestRecord(start=0.0, bucket="continued")
    stopped: int | None = None
    try:
        async with client.stream("POST", "/v1/chat/completions", json=body, headers=headers) as r:
            record.status = r.status_code
            instance = r.headers.get("x-route-instance", "-")
            async for line in r.aiter_lines():
                if not line.startswith("data: {"):
                    continue
                event = json.loads(line[6:])
                if "error" in event:
                    record.error = str(event["error"].get("message"))
                text = (event.get("choices") or [{}])[0].get("delta", {}).get("content")
                if not text:
                    continue
                now = time.perf_counter()
                record.output_tokens += 1
                if record.ttft is None:
                    record.ttft = now - t0
                elif stopped is None and now - t0 - record.ttft >= stop_after_s:
                    stopped = _process_group(state_dir, instance)
                    os.killpg(stopped, signal.SIGSTOP)
            record.e2e = time.perf_counter() - t0
            if stopped is None and record.error is None:
                record.error = "the answer ended before its instance was stopped"
            record.ok = r.status_code == 200 and record.error is None
    finally:
        if stopped is not None:
            os.killpg(stopped, signal.SIGCONT)
    return Sent(trace_id, sent, record, served=2)


async def _drive_continued(
    router: str, key: str, state_dir: Path, total: int, stop_after_s: float
) -> list[Sent]:
    auth = {"Authorization": f"Bearer {key}"}
    async with httpx.AsyncClient(base_url=router, headers=auth, timeout=180) as client:
        return [await _continued_once(client, state_dir, stop_after_s) for _ in range(total)]


def _one(spans: Sequence[StoredSpan], name: str) -> StoredSpan | None:
    return next((s for s in spans if s.name == name), None)


def classify(spans: Sequence[StoredSpan]) -> str:
    request = _one(spans, "router.request")
    assert request is not None
    attempts = [s for s in spans if s.name == "router.attempt"]
    if int(request.attributes.get("route.continuations") or 0) > 0:
        return "continued"
    if any(a.attributes.get("attempt.hedge") for a in attempts):
        return "hedged"
    if len(attempts) > 1:
        return "failover"
    reason = str(request.attributes.get("route.reason", "-"))
    named = {"simple": "same-city simple", "hard": "hard-to-center"}
    return named.get(reason, f"other ({reason})")


def stages(sent: Sent, spans: Sequence[StoredSpan]) -> dict[str, float] | None:
    """Milliseconds per stage of :data:`STAGES`; None when a span is missing."""
    request, region, plan = (
        _one(spans, n) for n in ("router.request", "router.region", "router.plan")
    )
    # A continuation's attempt wins too; the first answer's winner is the TTFT path.
    won = [s for s in spans if s.name == "router.attempt" and s.attributes.get("attempt.won")]
    if request is None or region is None or plan is None or not won or sent.record.ttft is None:
        return None
    attempt = min(won, key=lambda s: s.start)
    served = next(
        (s for s in spans if s.name == "serve.request" and s.parent_id == attempt.span_id), None
    )
    if served is None:
        return None
    children = [s for s in spans if s.parent_id == served.span_id]
    queue = next((s for s in children if s.name == "serve.queue"), None)
    prefill = next((s for s in children if s.name == "serve.prefill"), None)
    first = attempt.events.get("first_token")
    if queue is None or prefill is None or first is None:
        return None
    bounds = [
        sent.sent,
        request.start,
        region.end,
        plan.end,
        attempt.start,
        served.start,
        queue.start,
        queue.end,
        prefill.end,
        first,
        sent.sent + sent.record.ttft,
    ]
    return {name: (b - a) * 1e3 for name, a, b in zip(STAGES, bounds[:-1], bounds[1:], strict=True)}


def _read(phoenix: str, sent: Sequence[Sent], wait_s: float) -> dict[str, list[StoredSpan]]:
    """Every trace, once its spans stop arriving (exporters batch for a second)."""
    traces: dict[str, list[StoredSpan]] = {}
    deadline = time.monotonic() + wait_s
    with httpx.Client(timeout=30) as client:
        pending = {s.trace_id: s.served for s in sent if s.record.ok}
        while pending and time.monotonic() < deadline:
            for trace_id, served in list(pending.items()):
                spans = fetch_trace(client, phoenix, trace_id)
                names = [s.name for s in spans]
                if {"router.request", "serve.prefill"} <= set(names) and (
                    names.count("serve.request") >= served
                ):
                    traces[trace_id] = spans
                    del pending[trace_id]
            if pending:
                time.sleep(0.5)
    return traces


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f}"


def report(sent: Sequence[Sent], traces: dict[str, list[StoredSpan]]) -> str:
    rows: dict[str, list[dict[str, float]]] = defaultdict(list)
    ttfts: dict[str, list[float]] = defaultdict(list)
    incomplete = 0
    for s in sent:
        spans = traces.get(s.trace_id)
        if spans is None:
            continue
        cut = stages(s, spans)
        if cut is None:
            incomplete += 1
            continue
        cls = classify(spans)
        rows[cls].append(cut)
        assert s.record.ttft is not None
        ttfts[cls].append(s.record.ttft * 1e3)
    head = ["class", "n", *STAGES, "spans cover", "gap", "client TTFT", "TTFT P50"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    order = [c for c in CLASSES if c in rows] + sorted(c for c in rows if c not in CLASSES)
    for cls in order:
        cuts = rows[cls]
        means = {k: statistics.fmean(c[k] for c in cuts) for k in STAGES}
        gap = means["client→router"] + means["router→client"]
        ttft = statistics.fmean(ttfts[cls])
        cells = [cls, str(len(cuts)), *(_ms(means[k]) for k in STAGES)]
        cells += [_ms(ttft - gap), _ms(gap), _ms(ttft), _ms(percentile(ttfts[cls], 50))]
        lines.append("| " + " | ".join(cells) + " |")
    missing = [c for c in CLASSES if c not in rows]
    failed = [s for s in sent if not s.record.ok]
    lines.append("")
    lines.append(
        f"{len(sent)} requests sent, {len(failed)} failed, {len(traces)} traces read back, "
        f"{incomplete} without a complete first-token path; no request was "
        f"{', '.join(missing) if missing else '(every class occurred)'}."
    )
    for s in failed[:5]:
        lines.append(f"- failed ({s.record.bucket}): {s.record.error}")
    gaps = [c["client→router"] + c["router→client"] for cuts in rows.values() for c in cuts]
    if gaps:
        lines.append(
            f"Per request, the gap (client TTFT − what the spans cover) ran from "
            f"{min(gaps):.2f} to {max(gaps):.2f} ms (P50 {percentile(gaps, 50):.2f} ms)."
        )
    for s in sent:
        spans = traces.get(s.trace_id)
        if spans is not None and classify(spans) == "continued":
            lines += ["", *continued_detail(spans)]
    return "\n".join(lines)


def continued_detail(spans: Sequence[StoredSpan]) -> list[str]:
    """A continued request's trace, span by span (the intake stages left out)."""
    by_id = {s.span_id: s for s in spans}
    root = _one(spans, "router.request")
    assert root is not None
    lines = [f"Trace {root.trace_id} (continued), spans from the request's start:", ""]
    lines += ["| span | instance | starts at ms | lasts ms | says |", "|---|---|---|---|---|"]
    keys = ("attempt.index", "attempt.won", "attempt.outcome", "continuation.outcome",
            "continuation.tokens_before", "route.continuations", "serve.completion_tokens",
            "cancelled")  # fmt: skip
    for span in sorted(spans, key=lambda x: x.start):
        if span.name.startswith("router.") and span.name[7:] in STAGE_SPANS:
            continue
        owner = span
        while "route.instance" not in owner.attributes and owner.parent_id in by_id:
            owner = by_id[owner.parent_id]  # an instance's spans: their attempt's instance
        instance = owner.attributes.get("route.instance", "-") if owner is not root else "-"
        says = ", ".join(f"{k}={span.attributes[k]}" for k in keys if k in span.attributes)
        at, took = (span.start - root.start) * 1e3, span.duration_ms
        lines.append(f"| {span.name} | {instance} | {at:.1f} | {took:.1f} | {says} |")
    return lines


STAGE_SPANS = ("auth", "body", "limit", "region", "classify", "plan")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--router", default="http://127.0.0.1:8080")
    parser.add_argument("--phoenix", default="http://127.0.0.1:6006")
    parser.add_argument("--key", default="sk-local-dev", help="an operator key of the router")
    parser.add_argument("--requests", type=int, default=36)
    parser.add_argument("--concurrency", type=int, default=2)
    parser.add_argument("--max-tokens", type=int, default=32)
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--wait", type=float, default=30.0, help="for spans to arrive (s)")
    parser.add_argument(
        "--continued", type=int, default=0, help="then force this many continuations"
    )
    parser.add_argument(
        "--stop-after", type=float, default=0.5, help="first token to stopping its instance (s)"
    )
    parser.add_argument(
        "--state-dir", type=Path, default=Path("var"), help="the topology's (state_dir)"
    )
    args = parser.parse_args()
    workload = builtin_workload("realistic", "auto", max_tokens=args.max_tokens, seed=args.seed)
    began = time.monotonic()
    sent = asyncio.run(_drive(args.router, args.key, workload, args.requests, args.concurrency))
    print(f"sent {len(sent)} requests in {time.monotonic() - began:.1f}s", flush=True)
    if args.continued:
        began = time.monotonic()
        sent += asyncio.run(
            _drive_continued(args.router, args.key, args.state_dir, args.continued, args.stop_after)
        )
        print(f"{args.continued} continued in {time.monotonic() - began:.1f}s", flush=True)
    traces = _read(args.phoenix, sent, args.wait)
    print(report(sent, traces))


if __name__ == "__main__":
    main()
