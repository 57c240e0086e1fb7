"""Through the router to the project's own edge agents on the real model (kept few and short).

Two edge agents run as subprocesses in two regions; the router (the real
``geo-router serve`` CLI as a subprocess) knows them by URL.
"""

from __future__ import annotations

import json
import signal
from collections.abc import Iterator
from contextlib import ExitStack
from pathlib import Path

import httpx
import openai
import pytest

from tests.geo_router.conftest import KEY, edge_agent, router_process, router_settings, upstream

pytestmark = [pytest.mark.model, pytest.mark.slow]

AUTH = {"Authorization": f"Bearer {KEY}"}


@pytest.fixture(scope="module")
def fleet(
    tmp_path_factory: pytest.TempPathFactory, model_path: Path
) -> Iterator[dict[str, object]]:
    with ExitStack() as stack:
        east, east_proc = edge_agent(stack, "east")
        west, west_proc = edge_agent(stack, "west")
        ups = [upstream(east, id="edge-east"), upstream(west, region="west", id="edge-west")]
        settings = router_settings(ups, routing={"ttft_deadline_s": 20.0, "slow_start_s": 0})
        router_url = router_process(stack, settings, tmp_path_factory.mktemp("router"))
        yield {"router": router_url, "edge-east": east_proc, "edge-west": west_proc}


def test_openai_sdk_through_the_router_to_a_real_edge_agent(fleet: dict[str, object]) -> None:
    client = openai.OpenAI(base_url=f"{fleet['router']}/v1", api_key=KEY)
    msgs = [{"role": "user", "content": "Say hello."}]
    raw = client.chat.completions.with_raw_response.create(
        model="auto",
        messages=msgs,
        max_tokens=8,
        temperature=0,  # type: ignore[arg-type]
    )
    route = (raw.headers["x-route-instance"], raw.headers["x-route-reason"])
    assert route == ("edge-east", "simple"), raw.headers
    done = raw.parse()
    assert done.choices[0].message.content
    assert done.model == "smollm2-135m-instruct"
    stream = client.chat.completions.create(
        model="auto",
        messages=msgs,
        max_tokens=8,
        stream=True,  # type: ignore[arg-type]
    )
    assert "".join(c.choices[0].delta.content or "" for c in stream if c.choices)


def test_sigkill_of_the_serving_edge_mid_stream_continues_on_the_other(
    fleet: dict[str, object],
) -> None:
    body = {
        "model": "auto",
        "messages": [{"role": "user", "content": "Count from 1 to 50, separated by commas."}],
        "max_tokens": 60,
        "temperature": 0,
        "stream": True,
    }
    texts: list[str] = []
    with (
        httpx.Client(timeout=60) as c,
        c.stream("POST", f"{fleet['router']}/v1/chat/completions", json=body, headers=AUTH) as r,
    ):
        served = r.headers["x-route-instance"]
        victim = fleet[served]
        assert hasattr(victim, "send_signal")
        lines = r.iter_lines()
        for line in lines:
            if line.startswith("data: {"):
                texts.append(json.loads(line[6:])["choices"][0]["delta"].get("content") or "")
                if len(texts) == 4:
                    victim.send_signal(signal.SIGKILL)
                    break
        rest = [line for line in lines if line.startswith("data: ")]
    assert rest[-1] == "data: [DONE]"
    events = [json.loads(x[6:]) for x in rest[:-1]]
    assert not any("error" in e for e in events), events
    texts += [e["choices"][0]["delta"].get("content") or "" for e in events if e["choices"]]
    assert len("".join(texts)) > len("".join(texts[:4]))  # the answer went on
    metrics = httpx.get(f"{fleet['router']}/metrics").text
    assert 'router_continuations_total{outcome="ok"} 1.0' in metrics
    # The dead edge is now routed around for fresh requests.
    r = httpx.post(
        f"{fleet['router']}/v1/chat/completions",
        json={**body, "stream": False, "max_tokens": 4},
        headers=AUTH,
        timeout=60,
    )
    assert r.status_code == 200
    assert r.headers["x-route-instance"] == ({"edge-east", "edge-west"} - {served}).pop()
