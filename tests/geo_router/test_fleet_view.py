"""Two routers, one fleet view: real edge agents report what they hold, routers agree.

Two edge agents in one city and two ``geo-router serve`` processes that share
nothing but the edges' load reports. Customer-service traffic (one long system
prompt, short questions) alternates between the routers.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import httpx
import pytest

from hybrid_llm.local.servers import free_port, service_process
from tests.geo_router.conftest import KEY, router_settings, upstream

pytestmark = [pytest.mark.model, pytest.mark.slow]

AUTH = {"Authorization": f"Bearer {KEY}"}
# About 450 tokens of a store's customer-service instructions.
SYSTEM = " ".join(
    f"Rule {i}: be polite, answer briefly, and point customers to the help page for orders."
    for i in range(24)
)
QUESTIONS = [
    "Where is my parcel?",
    "Can I return shoes?",
    "Do you ship to Canada?",
    "How do I change my address?",
    "Is there a student discount?",
    "What are your opening hours?",
    "Can I pay by invoice?",
    "My order arrived damaged.",
    "How long does a refund take?",
    "Do you sell gift cards?",
    "Can I cancel an order?",
    "Where do I enter a voucher?",
]


def _edge_args(port: int, iid: str) -> list[str]:
    return [
        "edge_agent", "serve", "--config", "configs/edge-local.yaml",
        "--port", str(port), "--region", "east", "--id", iid,
    ]  # fmt: skip


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory, model_path: Path) -> Iterator[dict[str, Any]]:
    with ExitStack() as stack:
        edges = {}
        for iid in ("edge-1", "edge-2"):
            port = free_port()
            url = f"http://127.0.0.1:{port}"
            edges[iid] = (
                port,
                url,
                stack.enter_context(service_process(_edge_args(port, iid), url)),
            )
        ups = [upstream(url, id=iid) for iid, (_, url, _) in edges.items()]
        routers = []
        for n in range(2):
            settings = router_settings(
                ups, routing={"ttft_deadline_s": 30.0, "slow_start_s": 0, "p2c_window_ms": 200.0}
            )
            data = settings.model_dump(mode="json")
            data["server"]["port"] = port = free_port()
            cfg = tmp_path_factory.mktemp(f"router{n}") / "router.yaml"
            cfg.write_text(json.dumps(data))
            url = f"http://127.0.0.1:{port}"
            stack.enter_context(service_process(["geo_router", "serve", "--config", str(cfg)], url))
            routers.append(url)
        yield {"routers": routers, "edges": edges, "stack": stack}


def _ask(router: str, question: str) -> str:
    body = {
        "model": "auto",
        "max_tokens": 2,
        "temperature": 0,
        "messages": [{"role": "system", "content": SYSTEM}, {"role": "user", "content": question}],
    }
    r = httpx.post(f"{router}/v1/chat/completions", json=body, headers=AUTH, timeout=120)
    assert r.status_code == 200, r.text
    return r.headers["x-route-instance"]


def _explain(router: str, question: str) -> dict[str, Any]:
    body = {
        "model": "auto",
        "messages": [{"role": "system", "content": SYSTEM}, {"role": "user", "content": question}],
    }
    r = httpx.post(f"{router}/v1/route/explain", json=body, headers=AUTH, timeout=30)
    assert r.status_code == 200, r.text
    return {c["id"]: c for c in r.json()["candidates"]}


def _load(url: str) -> dict[str, Any]:
    data: dict[str, Any] = httpx.get(f"{url}/load", timeout=10).json()
    return data


def test_two_routers_warm_one_edge_and_forget_it_when_it_restarts(
    fleet: dict[str, Any],
) -> None:
    routers: list[str] = fleet["routers"]
    served = [_ask(routers[i % 2], q) for i, q in enumerate(QUESTIONS[:10])]
    home = max(set(served), key=served.count)
    assert served.count(home) >= 8, served
    # The system prompt was prefilled cold on one edge only: the other served
    # nothing, or only found it cached.
    other = next(iid for iid in fleet["edges"] if iid != home)
    other_load = _load(fleet["edges"][other][1])
    assert other_load["prefix_cache_query_tokens"] == 0 or other_load["prefix_cache_hit_tokens"]
    # Each router credits the home edge from the edge's own report once it has
    # polled the edge after the last send (until then its own record of that
    # send is the larger figure and is named "router").
    for router in routers:
        deadline = time.monotonic() + 10
        while (seen := _explain(router, "Do you deliver on Sundays?")[home])[
            "cached_source"
        ] != "reported":
            assert time.monotonic() < deadline, seen
            time.sleep(0.2)
        assert seen["cached_tokens"] > 300
    # The home edge restarts (its cache is gone): within a few seconds no router credits it.
    port, url, proc = fleet["edges"][home]
    proc.kill()
    proc.wait()
    fleet["stack"].enter_context(service_process(_edge_args(port, home), url))
    deadline = time.monotonic() + 10
    while True:
        seen_now = [_explain(r, "Do you deliver on Sundays?").get(home) for r in routers]
        if all(s is not None and s["cached_tokens"] == 0 for s in seen_now):
            break
        assert time.monotonic() < deadline, seen_now
        time.sleep(0.2)
