"""The load generator against a real local server with known delays."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pytest

from hybrid_llm.bench import (
    Conversation,
    ConversationWorkload,
    LoadStep,
    RunPlan,
    StepRun,
    Variant,
    Workload,
    build_report,
    builtin_workload,
    compare,
    find_knee,
    parse_bucket,
    parse_dataset,
    percentile,
    run_plan,
)
from hybrid_llm.bench.client import server_timing_s
from hybrid_llm.cli import main
from hybrid_llm.local.servers import UvicornThread
from tests.hybrid_llm.fake_openai import Timing, create_app

TTFT, ITL, TOKENS = 0.08, 0.02, 8
# Scheduling on a loaded 2-core box adds a little; it never removes time.
SLACK_MS = 40.0


@pytest.fixture(scope="module")
def server() -> object:
    with UvicornThread(create_app(Timing(ttft=TTFT, itl=ITL))) as srv:
        yield srv


def _plan(url: str, **kw: object) -> RunPlan:
    defaults: dict[str, object] = {
        "url": url,
        "workload": Workload("m", [parse_bucket(f"32:{TOKENS}")]),
        "steps": [LoadStep("concurrency", 2)],
        "variants": [Variant("default")],
        "duration": 1.0,
        "max_requests": 8,
    }
    defaults.update(kw)
    return RunPlan(**defaults)  # type: ignore[arg-type]


@pytest.mark.anyio
async def test_measured_timing_matches_known_server_delays(server: UvicornThread) -> None:
    runs = await run_plan(_plan(server.url))
    records = runs[0].records
    assert len(records) == 8
    assert all(r.ok for r in records), [r.error for r in records]
    ttft = [r.ttft * 1000 for r in records if r.ttft is not None]
    itl = [g * 1000 for r in records for g in r.itl]
    e2e = [r.e2e * 1000 for r in records if r.e2e is not None]
    tpot = [r.tpot * 1000 for r in records if r.tpot is not None]
    expected_e2e = (TTFT + (TOKENS - 1) * ITL) * 1000
    # Never faster than the server's sleeps (a measurement bug would be)...
    assert min(ttft) >= TTFT * 1000 - 1
    assert min(e2e) >= expected_e2e - 1
    # ...and, at the median, not much slower: scheduling on a busy box only adds.
    assert percentile(ttft, 50) <= TTFT * 1000 + SLACK_MS  # type: ignore[operator]
    assert ITL * 1000 - 5 <= percentile(itl, 50) <= ITL * 1000 + SLACK_MS / 3  # type: ignore[operator]
    assert abs(percentile(tpot, 50) - ITL * 1000) < 8  # type: ignore[operator]
    assert percentile(e2e, 50) <= expected_e2e + 2 * SLACK_MS  # type: ignore[operator]
    for r in records:
        assert r.output_tokens == TOKENS
        assert len(r.itl) == TOKENS - 1
        # Server usage: prompt tokens and the prefix-cache hits among them.
        assert r.prompt_tokens == 32
        assert r.cached_tokens == 16


@pytest.mark.anyio
async def test_routes_grouped_from_router_headers(server: UvicornThread) -> None:
    plan = _plan(
        server.url,
        variants=[Variant("hybrid"), Variant("center", {"X-Want-Tier": "center"})],
        max_requests=4,
    )
    report = build_report(plan, await run_plan(plan), "ttft_ms.p99")
    by_variant = {s["variant"]: s["summary"] for s in report["steps"]}
    assert list(by_variant["hybrid"]["by_route"]) == ["edge/region-a"]
    assert list(by_variant["center"]["by_route"]) == ["center/region-a"]
    assert by_variant["center"]["route_reasons"] == {"pinned": 4}


@pytest.mark.anyio
async def test_the_routers_predicted_ttft_is_scored_against_the_measured_one() -> None:
    # The router predicted half the TTFT the server takes: every request under-predicted.
    with UvicornThread(create_app(Timing(ttft=0.2, itl=0.0, predicted_ttft_ms=100))) as srv:
        plan = _plan(srv.url, max_requests=4)
        report = build_report(plan, await run_plan(plan), "ttft_ms.p99")
    error = report["steps"][0]["summary"]["prediction"]
    assert error["n"] == 4
    assert error["under_share"] == 1.0
    assert 0.4 < error["mape"] < 0.55  # |100 - 200..220| / 200..220
    # Beside each request's TTFT, the router's own (its Server-Timing stages) and where.
    requests = report["steps"][0]["requests"]
    assert [r["router_ttft"] for r in requests] == [pytest.approx(0.2005)] * 4
    assert {r["instance"] for r in requests} == {"edge-1"}
    assert all(r["ttft"] >= r["router_ttft"] for r in requests)


@pytest.mark.anyio
async def test_each_request_records_what_the_routers_prediction_rested_on() -> None:
    """A repeat predicted like a prefill: was the router's cached count short, or was
    something counted running there? The record says, beside the engine's count."""
    basis = (
        "fitted; prompt_tokens=821; cached_tokens=704; wait_ms=12; reported_wait_ms=700;"
        " running=1; rtt_ms=21.5; ms_per_token=7.25"
    )
    timing = Timing(ttft=0.01, itl=0.0, predicted_ttft_ms=817, prediction=basis)
    with UvicornThread(create_app(timing)) as srv:
        plan = _plan(srv.url, max_requests=2)
        report = build_report(plan, await run_plan(plan), "ttft_ms.p99")
    for r in report["steps"][0]["requests"]:
        assert r["route_basis"] == "fitted"
        assert (r["router_prompt_tokens"], r["router_cached_tokens"]) == (821, 704)
        assert (r["router_wait_ms"], r["router_reported_wait_ms"]) == (12.0, 700.0)
        assert r["router_running"] == 1
        assert (r["router_rtt_ms"], r["router_ms_per_token"]) == (21.5, 7.25)
        assert r["prompt_tokens"] > 0  # the engine's own count stays beside it


def test_server_timing_adds_up_the_routers_stages() -> None:
    assert server_timing_s("auth;dur=0.07, plan;dur=0.40, upstream;dur=443.64") == (
        pytest.approx(0.44411)
    )
    assert server_timing_s('cache;desc="hit", db;dur=2') == pytest.approx(0.002)
    assert server_timing_s(None) is None


def test_prediction_error_counts_only_requests_with_a_prediction() -> None:
    from hybrid_llm.bench import RequestRecord
    from hybrid_llm.bench.stats import prediction_error

    def rec(ttft: float, predicted: float | None, p90: float | None = None) -> RequestRecord:
        return RequestRecord(
            0.0, "w", ok=True, ttft=ttft, predicted_ttft=predicted, predicted_ttft_p90=p90
        )

    records = [rec(1.0, 0.5), rec(1.0, 1.5, 2.0), rec(2.0, 2.0, 2.5), rec(3.0, 2.0, 2.5)]
    error = prediction_error([*records, rec(1.0, None)])
    assert error["n"] == 4
    assert error["mape"] == pytest.approx((0.5 + 0.5 + 0.0 + 1 / 3) / 4)
    assert error["under_share"] == pytest.approx(2 / 4)
    learned = error["learned"]
    assert learned["n"] == 3
    assert learned["under_share"] == pytest.approx(1 / 3)
    assert learned["within_p90"] == pytest.approx(2 / 3)
    nothing = prediction_error([rec(1.0, None)])
    assert (nothing["n"], nothing["mape"], nothing["learned"]["within_p90"]) == (0, None, None)
    from hybrid_llm.bench.report import _prediction

    assert _prediction(error) == (
        "MAPE 33%, under-predicted 50% of 4; "
        "learned: MAPE 28%, under-predicted 33%, within P90 67% of 3"
    )
    assert _prediction(nothing) == ""


@pytest.mark.anyio
async def test_errors_counted_and_completions_api() -> None:
    with UvicornThread(create_app(Timing(ttft=0.0, itl=0.0, fail_every=3))) as srv:
        workload = Workload("m", [parse_bucket("8:4")], api="completions")
        plan = _plan(
            srv.url,
            workload=workload,
            max_requests=9,
            steps=[LoadStep("concurrency", 1)],
            max_backoff_s=0.0,  # do not honour the 429s' Retry-After here
        )
        report = build_report(plan, await run_plan(plan), "ttft_ms.p99")
    summary = report["steps"][0]["summary"]
    assert summary["requests"] == 9
    assert summary["ok"] == 6
    assert summary["error_rate"] == pytest.approx(3 / 9)
    assert summary["errors"] == {"HTTP 429": 3}
    assert summary["output_tokens"] == 6 * 4


@pytest.mark.anyio
async def test_poisson_rate_offers_about_the_rate(server: UvicornThread) -> None:
    plan = _plan(
        server.url,
        steps=[LoadStep("rate", 40)],
        variants=[Variant("a"), Variant("b")],
        duration=1.0,
        max_requests=500,
    )
    runs = await run_plan(plan)
    # 40/s for 1 s: Poisson, so allow a wide band; bounded by the duration.
    assert 20 <= len(runs[0].records) <= 65
    assert all(r.ok for r in runs[0].records)
    # Both variants saw the same arrivals: the same offered load.
    assert len(runs[1].records) == len(runs[0].records)


@pytest.mark.anyio
async def test_warm_up_runs_for_every_variant_at_its_concurrency_and_is_not_recorded() -> None:
    arrivals: list[tuple[str, int]] = []
    with UvicornThread(create_app(Timing(ttft=0.1, itl=0.0), arrivals)) as srv:
        plan = _plan(
            srv.url,
            variants=[Variant("hybrid"), Variant("center", {"X-Want-Tier": "center"})],
            steps=[LoadStep("concurrency", 1)],
            max_requests=2,
            warmup=3,
            warmup_concurrency=3,
        )
        runs = await run_plan(plan)
    assert [len(r.records) for r in runs] == [2, 2]  # the warm-up is not measured
    # Each variant warmed before any step: three at once (the last of each
    # burst arrives with two in flight), then the measured steps one at a time.
    tiers = [tier for tier, _ in arrivals]
    assert tiers == ["edge"] * 3 + ["center"] * 3 + ["edge"] * 2 + ["center"] * 2
    assert [max(n for _, n in arrivals[i : i + 3]) for i in (0, 3)] == [2, 2]


@pytest.mark.anyio
async def test_several_routers_take_requests_in_turn() -> None:
    seen_a: list[dict[str, object]] = []
    seen_b: list[dict[str, object]] = []
    with (
        UvicornThread(create_app(Timing(ttft=0.01, itl=0.001), seen=seen_a)) as a,
        UvicornThread(create_app(Timing(ttft=0.01, itl=0.001), seen=seen_b)) as b,
    ):
        runs = await run_plan(_plan(a.url, more_urls=(b.url,), max_requests=10))
    assert all(r.ok for r in runs[0].records)
    assert (len(seen_a), len(seen_b)) == (5, 5)


def test_percentile_and_knee() -> None:
    assert percentile([1, 2, 3, 4], 50) == 2.5
    assert percentile([5.0], 99) == 5.0
    assert percentile([], 50) is None
    load = [1, 2, 4, 8, 16, 32]
    flat_then_steep = [100, 101, 103, 110, 300, 900]
    # Kneedle on the linear load axis: the furthest point below the chord.
    assert find_knee(load, flat_then_steep) == 4
    assert find_knee(load, [100, 101, 103, 110, 700, 900]) == 3
    assert find_knee(load, [100, 200, 300, 400, 500, 600]) is None
    assert find_knee([1, 2], [1, 2]) is None


def test_variant_parsing() -> None:
    from hybrid_llm.bench.cli import parse_variant

    v = parse_variant("center:model=center,X-Client-Region=region-b")
    assert v == Variant("center", {"X-Client-Region": "region-b"}, "center")
    assert v.apply({"model": "auto"}) == {"model": "center"}
    assert parse_variant("hybrid") == Variant("hybrid")


def test_bucket_parsing() -> None:
    assert parse_bucket("1024:128:0.2").weight == 0.2
    with pytest.raises(ValueError, match="PROMPT:OUTPUT"):
        parse_bucket("12")
    with pytest.raises(ValueError, match="positive"):
        parse_bucket("0:5")


def test_compare_flags_only_real_regressions() -> None:
    def rep(ttft: float, rps: float, err: float) -> dict[str, object]:
        summary = {
            "ttft_ms": {"p50": ttft, "p95": ttft, "p99": ttft},
            "requests_per_s": rps,
            "error_rate": err,
        }
        return {"steps": [{"variant": "v", "step": "c=1", "summary": summary}]}

    assert compare(rep(100, 10, 0), rep(100, 10, 0)) == []
    assert compare(rep(105, 10, 0), rep(100, 10, 0)) == []
    assert compare(rep(100.5, 10, 0), rep(1.0, 10, 0), min_delta_ms=200) == []
    found = {r.metric for r in compare(rep(150, 8, 0.05), rep(100, 10, 0))}
    assert found == {"ttft_ms.p50", "ttft_ms.p95", "ttft_ms.p99", "requests_per_s", "error_rate"}


def test_cli_writes_report_and_plot_and_flags_regression(tmp_path: Path) -> None:
    args = ["--concurrency", "1,2", "--duration", "0.5", "--requests", "4", "--bucket", "16:4"]
    with UvicornThread(create_app(Timing(ttft=0.01, itl=0.005))) as fast:
        base = tmp_path / "base.json"
        assert main(["bench", "--url", fast.url, *args, "--out", str(base)]) == 0
    report = json.loads(base.read_text())
    assert [s["step"] for s in report["steps"]] == ["c=1", "c=2"]
    assert base.with_suffix(".png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    with UvicornThread(create_app(Timing(ttft=0.1, itl=0.005))) as slow:
        out = tmp_path / "slow.json"
        code = main(
            [
                "bench",
                "--url",
                slow.url,
                *args,
                "--out",
                str(out),
                "--no-plot",
                "--baseline",
                str(base),
            ]
        )
    assert code == 3
    assert any("ttft_ms.p50" in r for r in json.loads(out.read_text())["regressions"])


@pytest.mark.anyio
async def test_a_conversation_sends_its_turns_with_the_real_answers_as_history() -> None:
    seen: list[dict[str, object]] = []
    chats = {"chat": [Conversation("chat", (), ("first?", "second?", "third?"))]}
    workload = ConversationWorkload("m", chats, {"chat": 1.0}, max_tokens=3)
    with UvicornThread(create_app(Timing(ttft=0.0, itl=0.0), seen=seen)) as srv:
        plan = _plan(srv.url, workload=workload, max_requests=3, steps=[LoadStep("concurrency", 1)])
        runs = await run_plan(plan)
    records = runs[0].records
    assert [r.turn for r in records] == [0, 1, 2]
    assert [len(b["messages"]) for b in seen] == [1, 3, 5]  # type: ignore[arg-type]
    third = seen[2]["messages"]
    assert third == [  # the server's own answers, as a chat client keeps them
        {"role": "user", "content": "first?"},
        {"role": "assistant", "content": " w0 w1 w2"},
        {"role": "user", "content": "second?"},
        {"role": "assistant", "content": " w0 w1 w2"},
        {"role": "user", "content": "third?"},
    ]


@pytest.mark.anyio
async def test_a_refused_turn_ends_its_conversation_and_the_worker_honours_retry_after() -> None:
    chats = {"chat": [Conversation("chat", (), ("a", "b", "c"))]}
    workload = ConversationWorkload("m", chats, {"chat": 1.0}, max_tokens=2)
    with UvicornThread(create_app(Timing(ttft=0.0, itl=0.0, fail_every=2))) as srv:
        plan = _plan(
            srv.url, workload=workload, max_requests=50, steps=[LoadStep("concurrency", 1)]
        )
        records = (await run_plan(plan))[0].records
    # One second of run: ok, 429 (Retry-After: 1), then the run is over.
    assert [r.status for r in records] == [200, 429]
    assert records[1].retry_after == 1.0
    summary = build_report(plan, [StepRun(LoadStep("concurrency", 1), "v", 1.0, records)], "x")
    assert summary["steps"][0]["summary"]["shed"] == 1


def test_the_default_workload_is_a_realistic_mix_not_filler() -> None:
    workload = builtin_workload("realistic", "auto", seed=1)
    drawn = Counter(workload.conversation().label for _ in range(400))
    assert set(drawn) == {"customer-service", "chat", "mixed", "long-context"}
    assert 0.3 < drawn["customer-service"] / 400 < 0.5
    support = builtin_workload("customer-service", "auto").conversation()
    assert support.prefix[0]["role"] == "system"
    assert 1600 < len(support.prefix[0]["content"]) < 2600  # about 450 tokens
    mixed = builtin_workload("mixed", "auto").pools["mixed"]
    assert len(mixed) > 1000
    assert any(c.prefix for c in mixed)  # system prompts and histories, as labelled


def test_route_shares_and_same_city_share_in_the_summary() -> None:
    from hybrid_llm.bench import RequestRecord, summarize

    def rec(tier: str, region: str) -> RequestRecord:
        return RequestRecord(0.0, "w", ok=True, status=200, ttft=0.1, e2e=0.2, tier=tier,
                             region=region, user_region="region-a")  # fmt: skip

    records = [rec("edge", "region-a")] * 6 + [rec("edge", "region-b")] * 2
    records += [rec("center", "c")] * 2
    shares = summarize(records, 1.0)["route_shares"]
    assert shares == {"edge": 0.8, "center": 0.2, "same_city": 0.6}


def test_dataset_lines_split_only_at_newlines(tmp_path: Path) -> None:
    """Real chat text carries U+2028 and U+0085 raw in JSON lines; they are not line ends."""
    text = "first\u2028second\x85third"
    path = tmp_path / "chat.jsonl"
    record = {"messages": [{"role": "user", "content": text}]}
    path.write_text(json.dumps(record, ensure_ascii=False) + "\n", encoding="utf-8")
    (conv,) = parse_dataset(path)
    assert conv.turns == (text,)


def test_datasets_in_openai_sharegpt_and_aiperf_shapes(tmp_path: Path) -> None:
    system = {"role": "system", "content": "S"}
    openai = tmp_path / "openai.jsonl"
    record = {"messages": [system, {"role": "user", "content": "q"}], "max_tokens": 9}
    openai.write_text(json.dumps(record) + "\n")
    sharegpt = tmp_path / "sharegpt.json"
    talk = [("system", "S"), ("human", "h1"), ("gpt", "g1"), ("human", "h2")]
    conversations = [{"from": who, "value": value} for who, value in talk]
    sharegpt.write_text(json.dumps([{"id": "1", "conversations": conversations}]))
    aiperf = tmp_path / "aiperf.jsonl"
    turns = [{"role": "system", "text": "S"}, {"text": "t1"}, {"text": "t2", "output_length": 7}]
    lines = [{"text": "single", "output_length": 5}, {"session_id": "s", "turns": turns}]
    aiperf.write_text("".join(json.dumps(x) + "\n" for x in lines))
    assert parse_dataset(openai) == [Conversation("dataset", (system,), ("q",), 9)]
    (conv,) = parse_dataset(sharegpt)
    assert (conv.prefix, conv.turns) == ((system,), ("h1", "h2"))
    single, multi = parse_dataset(aiperf)
    assert (single.turns, single.max_tokens) == (("single",), 5)
    assert (multi.prefix[0]["content"], multi.turns, multi.max_tokens) == ("S", ("t1", "t2"), 7)
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"prompt_only": 1}\n')
    with pytest.raises(ValueError, match="record 0"):
        parse_dataset(bad)
