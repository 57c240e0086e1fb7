"""The gateway's /load reports the union of what its replicas' caches hold, so a router
credits the center with a prefix one of its replicas holds."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from fastapi import FastAPI

from central.app import create_app
from central.settings import CentralSettings
from geo_router.conversation import Turn
from geo_router.prefix_index import PrefixIndex
from hybrid_llm.local.servers import UvicornThread, all_replicas_healthy, wait_ready, wait_until
from servekit.engine.protocol import MAX_POOLED_PREFIX_BLOCKS, LoadReport, pooled_figures
from servekit.prefix_blocks import chained_names, conversation_text, sampled

SYSTEM = "You are the support desk of a bicycle shop; answer in two sentences. " * 8


def names_of(question: str) -> list[int]:
    text = conversation_text([("system", SYSTEM), ("user", question)])
    return chained_names(text, 64)


def held(*names: int, chars: int = 64) -> LoadReport:
    return LoadReport(ready=True, prefix_blocks=names, prefix_block_chars=chars)


def test_pooled_figures_union_the_replicas_reports() -> None:
    pooled = pooled_figures([held(1, 2, 3), held(3, 4), LoadReport(ready=True)], 3)
    assert pooled.prefix_blocks == (1, 3, 2, 4)  # each replica's first names first
    assert pooled.prefix_block_chars == 64
    # Reports in another block size cannot be looked up alike: the most common size wins.
    pooled = pooled_figures([held(1, chars=128), held(2), held(3)], 3)
    assert (pooled.prefix_blocks, pooled.prefix_block_chars) == ((2, 3), 64)
    assert pooled_figures([LoadReport(ready=True)], 1).prefix_blocks is None  # none says


def test_pooled_names_are_bounded_and_every_replica_keeps_its_first() -> None:
    big = [held(*range(r * 10_000, r * 10_000 + 5_000)) for r in range(3)]
    names = pooled_figures(big, 3).prefix_blocks
    assert names is not None
    assert len(names) == MAX_POOLED_PREFIX_BLOCKS
    assert {0, 10_000, 20_000} <= set(names)


def standin(report: dict[str, Any]) -> FastAPI:
    """A replica that reports its own load (an edge agent as a stand-in does)."""
    app = FastAPI()

    @app.get("/health")
    async def health() -> dict[str, str]:
        return {"status": "ok"}

    @app.get("/load")
    async def load() -> dict[str, Any]:
        return report

    return app


@pytest.fixture
def replicas() -> Iterator[tuple[UvicornThread, UvicornThread]]:
    first = tuple(sampled(names_of("Do you fix flat tyres?"), 4))
    second = tuple(sampled(names_of("Do you sell helmets?"), 4))
    a = held(*first).to_dict()
    b = held(*second).to_dict()
    with UvicornThread(standin(a)) as one, UvicornThread(standin(b)) as two:
        yield one, two


def test_the_gateway_reports_and_a_router_credits_its_replicas_prefixes(
    replicas: tuple[UvicornThread, UvicornThread], tmp_path: Path
) -> None:
    settings = CentralSettings.model_validate(
        {
            "model": "big",
            "replicas": [
                {"name": f"r{i}", "kind": "url", "url": r.url, "load_source": "load"}
                for i, r in enumerate(replicas)
            ],
            "supervision": {"health_interval_s": 0.1, "scrape_interval_s": 0.1,
                            "log_dir": str(tmp_path)},
        }
    )  # fmt: skip
    with UvicornThread(create_app(settings)) as gateway:
        wait_ready(gateway.url, timeout=10)
        wait_until(lambda: all_replicas_healthy(gateway.url), what="healthy")
        report = LoadReport.from_dict(httpx.get(gateway.url + "/load").json())
    assert report.prefix_block_chars == 64
    index = PrefixIndex(block_chars=64)
    for question in ("Do you fix flat tyres?", "Do you sell helmets?"):
        turns = [Turn("system", SYSTEM), Turn("user", question)]
        prefix = index.prefix(turns, prompt_tokens=160)
        cached = index.cached_blocks("center", prefix, report)
        assert cached.source == "reported"
        assert cached.blocks == len(names_of(question))
    other = index.prefix([Turn("user", "Where is the shop?" * 10)], prompt_tokens=40)
    assert index.cached_blocks("center", other, report).source == "none"
