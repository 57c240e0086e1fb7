"""The router ends an answer at its stream deadline, however steadily it is read: the
client's last events are the error and [DONE], the upstream stream is cancelled and the
tenant's max_streams slot comes back; a key's own deadline replaces the server's."""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any

import httpx
import pytest

from geo_router.app import create_app
from hybrid_llm.local.servers import UvicornThread, wait_until
from tests.geo_router.conftest import BATCH_KEY, KEY, router_settings, serve_fake, upstream
from tests.geo_router.fake_upstream import Behavior

pytestmark = pytest.mark.anyio

PATH = "/v1/chat/completions"
CHAT = {"model": "auto", "messages": [{"role": "user", "content": "hello there"}]}


def _events(text: str) -> list[str]:
    return [line.removeprefix("data: ") for line in text.splitlines() if line.startswith("data:")]


async def test_a_stream_past_its_deadline_ends_with_an_error_and_frees_its_slot() -> None:
    keys: list[dict[str, Any]] = router_settings([]).auth.model_dump()["keys"]
    keys[0].update(max_streams=1, stream_deadline_s=0.6)  # KEY's own deadline
    edge = Behavior(words=100, token_delay_s=0.05)  # a 5 s answer, read as it comes
    with serve_fake(edge) as url:
        settings = router_settings(
            [upstream(url)], auth={"keys": keys}, server={"stream_deadline_s": 1.5}
        )
        with UvicornThread(create_app(settings)) as srv:
            async with httpx.AsyncClient(base_url=srv.url, timeout=30) as c:
                body = {**CHAT, "stream": True, "max_tokens": 100}
                began = time.monotonic()
                auth = {"Authorization": f"Bearer {KEY}"}
                r = await c.post(PATH, json=body, headers=auth)
                took = time.monotonic() - began
                events = _events(r.text)
                assert r.status_code == 200
                assert events[-1] == "[DONE]"
                error = json.loads(events[-2])["error"]
                assert error["code"] == "stream_deadline_exceeded", events[-2]
                assert 0.6 <= took < 1.4  # the key's deadline, not the server's
                assert len(events) > 3  # tokens came before it
                # The upstream stream was cancelled, not read out.
                await asyncio.to_thread(wait_until, lambda: edge.aborted == 1, 5, "abort")
                # The tenant's one stream came back: a second one is served.
                short = {**CHAT, "max_tokens": 2}
                r = await c.post(PATH, json=short, headers=auth)
                assert r.status_code == 200, r.text
                # Another key, without a deadline of its own, gets the server's.
                began = time.monotonic()
                other = {"Authorization": f"Bearer {BATCH_KEY}"}
                r = await c.post(PATH, json=body, headers=other)
                took = time.monotonic() - began
                error = json.loads(_events(r.text)[-2])["error"]
                assert error["code"] == "stream_deadline_exceeded"
                assert 1.5 <= took < 3.0


async def test_a_whole_answer_past_its_deadline_gets_504_in_the_openai_shape() -> None:
    edge = Behavior(words=100, token_delay_s=0.05)
    with serve_fake(edge) as url:
        settings = router_settings([upstream(url)], server={"stream_deadline_s": 0.6})
        with UvicornThread(create_app(settings)) as srv:
            async with httpx.AsyncClient(base_url=srv.url, timeout=30) as c:
                auth = {"Authorization": f"Bearer {KEY}"}
                r = await c.post(PATH, json={**CHAT, "max_tokens": 100}, headers=auth)
                assert r.status_code == 504, r.text
                assert r.json()["error"]["code"] == "stream_deadline_exceeded"
                await asyncio.to_thread(wait_until, lambda: edge.aborted == 1, 5, "abort")
