from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx
import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from hybrid_llm.local.servers import UvicornThread
from model_sync import ops
from model_sync.gates import GateUnavailable, PrometheusGate, evaluate
from model_sync.plan import PlanError, build_plan, parse_duration
from model_sync.records import GateSettings, NodeCounters
from model_sync.store import SyncStore, VersionExists
from servekit.registry import Registry
from servekit.registry.protocol import InstanceInfo
from tests.model_sync.helpers import make_artifact

pytestmark = pytest.mark.anyio


@pytest.mark.parametrize(
    ("text", "seconds"),
    [("90", 90), ("90s", 90), ("5m", 300), ("1h", 3600), ("1m30s", 90), ("250ms", 0.25)],
)
def test_parse_duration(text: str, seconds: float) -> None:
    assert parse_duration(text) == seconds


@pytest.mark.parametrize("text", ["", "5x", "m5", "1m 30s", "-1s"])
def test_parse_duration_rejects(text: str) -> None:
    with pytest.raises(ValueError, match="invalid duration"):
        parse_duration(text)


async def _fleet(tmp_path: Path, reg: Registry) -> tuple[Registry, SyncStore]:
    store = SyncStore(reg, actor="bob")
    for nid, region in (("n1", "eu"), ("n2", "eu"), ("n3", "us"), ("n4", "us"), ("n5", "ap")):
        await reg.register(
            InstanceInfo(nid, "edge", region, "127.0.0.1", 1, "tiny", "v1"), ttl_s=30
        )
    await reg.register(InstanceInfo("c1", "center", "eu", "127.0.0.1", 2, "tiny", "v1"), 30)
    await reg.register(InstanceInfo("other", "edge", "eu", "127.0.0.1", 3, "big", "v1"), 30)
    make_artifact(tmp_path / "m.gguf", 1000)
    await ops.push(store, str(tmp_path / "m.gguf"), model="tiny", version="v2")
    return reg, store


async def test_plan_percent_canary_and_ordered_regions(tmp_path: Path, registry: Registry) -> None:
    reg, store = await _fleet(tmp_path, registry)
    plan = await build_plan(reg, store, "tiny", "v2", canary="20%", waves="us,eu", bake_s=5)
    assert [(w.name, w.nodes) for w in plan.waves] == [
        ("canary", ["n3"]),
        ("region us", ["n4"]),
        ("region eu", ["n1", "n2"]),
        ("region ap", ["n5"]),  # regions not named follow
    ]
    assert plan.from_version == "v1"
    assert plan.previous == dict.fromkeys(["n1", "n2", "n3", "n4", "n5"], "v1")
    assert {w.bake_s for w in plan.waves} == {5}


async def test_plan_named_canary_and_single_wave(tmp_path: Path, registry: Registry) -> None:
    reg, store = await _fleet(tmp_path, registry)
    plan = await build_plan(reg, store, "tiny", "v2", canary="n5,n2")
    assert [(w.name, w.nodes) for w in plan.waves] == [
        ("canary", ["n5", "n2"]),
        ("all", ["n1", "n3", "n4"]),
    ]


@pytest.mark.parametrize(
    ("kw", "message"),
    [
        ({"version": "v9"}, "not registered"),
        ({"canary": "n1,zz"}, "canary nodes not serving this model: zz"),
        ({"canary": "0%"}, "percentage"),
        ({"waves": "mars"}, "no nodes of this model in region"),
    ],
)
async def test_plan_errors(
    tmp_path: Path, kw: dict[str, Any], message: str, registry: Registry
) -> None:
    reg, store = await _fleet(tmp_path, registry)
    version = kw.pop("version", "v2")
    with pytest.raises(PlanError, match=message):
        await build_plan(reg, store, "tiny", version, **kw)


async def test_push_is_idempotent_and_versions_are_immutable(
    tmp_path: Path, registry: Registry
) -> None:
    _reg, store = await _fleet(tmp_path, registry)
    again = await ops.push(store, str(tmp_path / "m.gguf"), model="tiny", version="v2")
    assert again.size == 1000
    assert again.filename == "m.gguf"
    assert again.format == "gguf"
    assert again.created_by == "bob"
    make_artifact(tmp_path / "other.gguf", 1000)
    with pytest.raises(VersionExists, match="publish a new version"):
        await ops.push(store, str(tmp_path / "other.gguf"), model="tiny", version="v2")
    assert [e.action for e in await store.history()] == ["push"]


async def test_push_from_url_hashes_the_served_bytes(tmp_path: Path, registry: Registry) -> None:
    from model_sync.artifacts import create_app

    data, digest = make_artifact(tmp_path / "served" / "x.gguf", 70_000)
    store = SyncStore(registry)
    with UvicornThread(create_app(tmp_path / "served")) as server:
        rec = await ops.push(store, f"{server.url}/x.gguf", model="tiny", version="v3")
    assert (rec.sha256, rec.size, rec.filename, rec.uri) == (
        digest,
        len(data),
        "x.gguf",
        f"{server.url}/x.gguf",
    )


def c(ok: int, failed: int, p95: float | None = None) -> NodeCounters:
    return NodeCounters(ok=ok, failed=failed, ttft_p95_ms=p95)


GATES = GateSettings(min_requests=50, max_error_rate=0.05, max_error_rate_increase=0.01)


def test_gate_passes_against_same_window_control() -> None:
    r = evaluate(
        GATES,
        new_nodes=["a"],
        old_nodes=["b"],
        start={"a": c(100, 0), "b": c(100, 1)},
        end={"a": c(200, 1, 120), "b": c(200, 2, 110)},
        baseline={},
    )
    assert r.verdict == "pass", r.reasons
    assert r.figures["old_source"] == "same window"
    assert r.figures["new_error_rate"] == pytest.approx(1 / 101, abs=1e-6)


def test_gate_fails_on_error_rate_rise_and_ttft() -> None:
    r = evaluate(
        GATES,
        new_nodes=["a"],
        old_nodes=["b"],
        start={"a": c(0, 0), "b": c(0, 0)},
        end={"a": c(96, 4, 400), "b": c(100, 0, 100)},
        baseline={},
    )
    assert r.verdict == "fail"
    assert r.reasons[0] == "error rate 4.00% vs 0.00% on the replaced version (allowed +1.00%)"
    assert r.reasons[1] == "TTFT P95 400 ms vs 100 ms (bound 200 ms)"


def test_ttft_is_judged_against_the_canarys_own_figure_before_the_rollout_too() -> None:
    """Another node serves other traffic: a canary that was as slow on the old
    version passes; one slower than both references fails."""
    for before, verdict in ((4000.0, "pass"), (2000.0, "fail")):
        r = evaluate(
            GATES,
            new_nodes=["a"],
            old_nodes=["b"],
            start={"a": c(0, 0), "b": c(0, 0)},
            end={"a": c(100, 0, 4600), "b": c(100, 0, 2700)},
            baseline={"a": c(50, 0, before), "b": c(50, 0, 2600)},
        )
        assert r.verdict == verdict, (before, r.reasons)
        assert r.figures["new_nodes_ttft_p95_before_ms"] == before
    assert r.reasons == ["TTFT P95 4600 ms vs 2700 ms (bound 4100 ms)"]


def test_gate_last_wave_uses_baseline_and_handles_counter_reset() -> None:
    # The new node restarted (counters went down): its counts start from zero.
    r = evaluate(
        GATES,
        new_nodes=["a", "b"],
        old_nodes=[],
        start={"a": c(1000, 10), "b": c(0, 0)},
        end={"a": c(60, 0, 90), "b": c(40, 0, 95)},
        baseline={"a": c(900, 9, 100), "b": c(900, 9, 80)},
    )
    assert r.verdict == "pass", r.reasons
    assert r.figures["new_requests"] == 100
    assert r.figures["old_source"] == "before the rollout"
    assert r.figures["old_ttft_p95_ms"] == 100


def test_gate_inconclusive_with_too_few_requests() -> None:
    r = evaluate(GATES, new_nodes=["a"], old_nodes=[], start={}, end={"a": c(10, 0)}, baseline={})
    assert r.verdict == "inconclusive"
    assert r.summary() == "only 10 requests on the new version during the bake (need 50)"


def _prometheus_double(answers: dict[str, float | None], seen: list[str]) -> Starlette:
    async def query(request: Request) -> JSONResponse:
        q = request.query_params["query"]
        seen.append(q)
        value = next((v for k, v in answers.items() if k in q), None)
        result = [] if value is None else [{"metric": {}, "value": [0, str(value)]}]
        return JSONResponse(
            {"status": "success", "data": {"resultType": "vector", "result": result}}
        )

    return Starlette(routes=[Route("/api/v1/query", query)])


async def test_prometheus_gate_substitutes_and_reads_scalars() -> None:
    seen: list[str] = []
    app = _prometheus_double({'"v2"}[90s])) err': 0.02, '"v2"}[90s]) ttft': 250.0}, seen)
    with UvicornThread(app) as server:
        async with httpx.AsyncClient() as client:
            gate = PrometheusGate(
                server.url,
                'sum(rate(x{model="$model",version="$version"}[$window])) err',
                'q(y{model="$model",version="$version"}[$window]) ttft',
                client,
            )
            assert await gate.figures("tiny", "v2", 90.4) == (0.02, 250.0)
            assert await gate.figures("tiny", "v1", 90) == (None, None)
            broken = PrometheusGate(server.url + "/nope", "a", "b", client)
            with pytest.raises(GateUnavailable, match="prometheus query 'a' failed"):
                await broken.figures("tiny", "v1", 1)
    assert seen[0] == 'sum(rate(x{model="tiny",version="v2"}[90s])) err'


def test_an_empty_bake_with_min_requests_zero_is_judged_not_a_crash() -> None:
    """min_requests 0 and no request in the bake window: the controller used to die on
    a division by zero; nothing failed on the new version, so it passes."""
    gates = GateSettings(min_requests=0)
    r = evaluate(
        gates,
        new_nodes=["a"],
        old_nodes=[],
        start={"a": NodeCounters(ok=5)},
        end={"a": NodeCounters(ok=5)},
        baseline={"a": NodeCounters(ok=5)},
    )
    assert r.verdict == "pass", r.reasons
