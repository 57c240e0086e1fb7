"""POST /v1/feedback: only the tenant that was served an answer rates it, once."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from geo_router.eval_classifier import acceptance
from tests.geo_router.conftest import BATCH_KEY, router_settings, serve_fake, upstream
from tests.geo_router.fake_upstream import Behavior
from tests.geo_router.test_app import CHAT, router

pytestmark = pytest.mark.anyio

HARD = {
    "model": "auto",
    "messages": [{"role": "user", "content": "Write a Python function that merges two lists."}],
}


async def test_a_served_answer_is_rated_once_by_its_own_tenant(
    auth: dict[str, str], tmp_path: Path
) -> None:
    log = tmp_path / "feedback.jsonl"
    with serve_fake(Behavior(model="small")) as e, serve_fake(Behavior(model="big")) as ctr:
        ups = [upstream(e, id="edge"), upstream(ctr, "center", "center", id="center")]
        async with router(router_settings(ups, feedback_log=str(log))) as c:
            r = await c.post("/v1/chat/completions", json=CHAT, headers=auth)
            assert r.headers["x-route-tier"] == "edge"
            answer_id = r.json()["id"]
            rated = await c.post(
                "/v1/feedback", json={"response_id": answer_id, "thumbs": "up"}, headers=auth
            )
            assert rated.status_code == 200, rated.text
            assert rated.json() == {
                "response_id": answer_id,
                "score": 1.0,
                "tier": "edge",
                "version": "v1",
                "task": "chat",
            }
            again = await c.post(
                "/v1/feedback", json={"response_id": answer_id, "score": 0.2}, headers=auth
            )
            assert again.status_code == 409
            assert again.json()["error"]["code"] == "conflict"

            # The router's own request id names the answer too; rate it by score.
            r = await c.post("/v1/chat/completions", json=HARD, headers=auth)
            assert r.headers["x-route-tier"] == "center"
            body = {"response_id": r.headers["x-request-id"], "score": 0.25, "comment": "wrong"}
            assert (await c.post("/v1/feedback", json=body, headers=auth)).status_code == 200

            # Another tenant's answer is as unknown as a made-up id.
            r = await c.post("/v1/chat/completions", json=CHAT, headers=auth)
            other = {"Authorization": f"Bearer {BATCH_KEY}"}
            theirs = {"response_id": r.json()["id"], "thumbs": "down"}
            for body, headers in ((theirs, other), ({"response_id": "nope", "score": 1}, auth)):
                got = await c.post("/v1/feedback", json=body, headers=headers)
                assert got.status_code == 404
                assert got.json()["error"]["param"] == "response_id"

            metrics = (await c.get("/metrics")).text
            assert (
                'router_feedback_total{model="small",task="chat",tier="edge",'
                'verdict="accepted",version="v1"} 1.0' in metrics
            )
    assert acceptance(log) == {
        "chat/edge": {"rated": 1, "accepted": 1.0},
        "code/center": {"rated": 1, "accepted": 0.0},
    }
    lines = [json.loads(x) for x in log.read_text().splitlines()]
    assert [(x["tier"], x["rating"], x["comment"]) for x in lines] == [
        ("edge", 1.0, None),
        ("center", 0.25, "wrong"),
    ]


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"thumbs": "up"}, "response_id"),
        ({"response_id": "x"}, "score"),
        ({"response_id": "x", "score": 1, "thumbs": "up"}, "score"),
        ({"response_id": "x", "score": 7}, "score"),
        ({"response_id": "x", "score": True}, "score"),
        ({"response_id": "x", "thumbs": "sideways"}, "thumbs"),
        ({"response_id": "x", "thumbs": "up", "comment": 5}, "comment"),
    ],
)
async def test_bad_feedback_is_a_400_naming_the_field(
    auth: dict[str, str], body: dict[str, object], param: str
) -> None:
    with serve_fake(Behavior()) as e:
        async with router(router_settings([upstream(e)])) as c:
            r = await c.post("/v1/feedback", json=body, headers=auth)
            assert r.status_code == 400
            assert r.json()["error"]["param"] == param
            assert (await c.post("/v1/feedback", content=b"{no", headers=auth)).status_code == 400
            assert (await c.post("/v1/feedback", json=body)).status_code == 401
