"""The ``openai`` SDK, unchanged, through the router on a real socket."""

from __future__ import annotations

import time

import httpx
import openai
import pytest

from geo_router.app import create_app
from hybrid_llm.local.servers import UvicornThread
from servekit.http_protocol import HeadWithBodyProtocol
from tests.geo_router.conftest import KEY, router_settings, serve_fake, upstream
from tests.geo_router.fake_upstream import Behavior


def test_sdk_streams_and_completes_and_retries_429_after_retry_after() -> None:
    with serve_fake(Behavior(words=5)) as edge:
        settings = router_settings([upstream(edge)])
        settings.auth.keys[0].rpm = 60  # one request a second, no burst: Retry-After is 1
        settings.auth.keys[0].burst_s = 1
        with UvicornThread(create_app(settings), http=HeadWithBodyProtocol) as server:
            client = openai.OpenAI(base_url=server.url + "/v1", api_key=KEY, max_retries=2)
            msgs = [{"role": "user", "content": "say five words"}]
            done = client.chat.completions.create(model="auto", messages=msgs)  # type: ignore[arg-type]
            assert done.choices[0].message.content == "w0 w1 w2 w3 w4"
            assert done.usage is not None
            assert done.usage.completion_tokens == 5
            start = time.monotonic()
            stream = client.chat.completions.create(
                model="auto",
                messages=msgs,  # type: ignore[arg-type]
                stream=True,
                stream_options={"include_usage": True},
            )
            parts = [c.choices[0].delta.content or "" for c in stream if c.choices]
            assert "".join(parts) == "w0 w1 w2 w3 w4"
            assert time.monotonic() - start >= 0.5  # the SDK waited for Retry-After
            metrics = httpx.get(server.url + "/metrics").text
            assert 'router_rejected_total{code="429"} 1.0' in metrics
            legacy = client.completions.create(model="fake-model", prompt="go: ")
            assert legacy.choices[0].text == "w0 w1 w2 w3 w4"
            with pytest.raises(openai.AuthenticationError):
                openai.OpenAI(base_url=server.url + "/v1", api_key="wrong").models.list()
