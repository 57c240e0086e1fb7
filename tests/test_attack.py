"""Issue 26's attack study run in CI: every finding it closes stays closed.

``studies/attack.py`` is meant to be run by hand against ``hybrid-llm up``;
here its :func:`~studies.attack.run` goes against a smaller real topology
built with the router tests' helpers: one edge agent on the real model and
the real ``geo-router serve``, with an operator key and a tenant key capped
at one stream. Any row answering the old way (``REGRESSED``) fails the test,
and the rows that only close with settings this topology sets (the tenant's
``max_streams``, the short ``header_timeout_s``) must be closed, not ``OPEN``.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import ExitStack
from pathlib import Path

import pytest

from studies import attack
from tests.geo_router.conftest import (
    BATCH_KEY,
    KEY,
    edge_agent,
    router_process,
    router_settings,
    upstream,
)

pytestmark = [pytest.mark.model, pytest.mark.slow]


@pytest.fixture(scope="module")
def router(tmp_path_factory: pytest.TempPathFactory, model_path: Path) -> Iterator[str]:
    with ExitStack() as stack:
        east, _ = edge_agent(stack, "east")
        settings = router_settings(
            [upstream(east, id="edge-east")],
            routing={"ttft_deadline_s": 20.0, "slow_start_s": 0},
            server={"header_timeout_s": 1.0},
        )
        settings.auth.keys[1].max_streams = 1  # the tenant's
        yield router_process(stack, settings, tmp_path_factory.mktemp("attack"))


def test_every_closed_finding_stays_closed(router: str) -> None:
    started = time.monotonic()
    rows = attack.run(router, KEY, tenant_key=BATCH_KEY, patience=5.0)
    took = time.monotonic() - started
    print(attack.table(rows), f"\n({took:.1f} s)")
    assert len(rows) == 25  # every row ran
    regressed = [row for row in rows if row.closed is False]
    assert not regressed, attack.table(regressed)
    left_open = {row.finding for row in rows if row.closed is None}
    assert not left_open, attack.table([r for r in rows if r.finding in left_open])
