"""The gateway's service tokens, its token to the replicas, and a /replicas without secrets."""

from __future__ import annotations

import json
import ssl
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from central.app import create_app
from central.commands import STANDIN_TOKEN_ENV, VLLM_TOKEN_ENV, build_plan
from central.settings import CentralSettings
from central.specs import LlamaCppReplica, VllmReplica
from hybrid_llm.local.engine_double import create_double
from hybrid_llm.local.servers import UvicornThread, wait_ready, wait_until
from tests.support.pki import PrivateCA

MODEL = "big"
GATEWAY_TOKEN = "svc-router-to-center"
REPLICA_TOKEN = "svc-center-to-replicas"
SECRETS = ("hf_secret_value", "lic-0000-1111", "hunter2", "sk-extra-arg", REPLICA_TOKEN)


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


def settings(tmp_path: Path, double_url: str) -> CentralSettings:
    tokens = tmp_path / "gateway-tokens"
    tokens.write_text(f"{GATEWAY_TOKEN}\n")
    return CentralSettings.model_validate(
        {
            "model": MODEL,
            "server": {"auth": {"tokens_file": str(tokens)}},
            "replica_client": {"token": REPLICA_TOKEN},
            "replicas": [
                {"name": "double", "kind": "url", "url": double_url, "load_source": "load"},
                # Never comes up (no vllm here): what matters is how it is shown.
                {
                    "name": "gpu",
                    "kind": "vllm",
                    "executable": str(tmp_path / "no-such-vllm"),
                    "model": "org/big",
                    "gpus": [0],
                    "env": {
                        "HF_TOKEN": "hf_secret_value",
                        "LICENSE_KEY": "lic-0000-1111",
                        "HF_HOME": "/var/lib/hf",
                    },
                    "extra_args": ["--api-key", "sk-extra-arg"],
                },
                {"name": "remote", "kind": "url", "url": "https://ops:hunter2@10.255.0.1:9"},
            ],
            "supervision": {
                "health_interval_s": 0.1,
                "scrape_interval_s": 0.1,
                "restart_backoff_initial_s": 30,
                "log_dir": str(tmp_path),
            },
        }
    )


def test_the_gateway_needs_its_token_sends_its_own_and_shows_no_secret(tmp_path: Path) -> None:
    with UvicornThread(create_double(MODEL, tokens=[REPLICA_TOKEN])) as double:
        anonymous = httpx.post(double.url + "/v1/chat/completions", json={"model": MODEL})
        assert anonymous.status_code == 401  # the replica takes only the gateway's token
        with UvicornThread(create_app(settings(tmp_path, double.url))) as gw:
            wait_ready(gw.url, timeout=60)
            chat = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}]}
            refused = httpx.post(gw.url + "/v1/chat/completions", json=chat)
            assert refused.status_code == 401
            assert refused.json()["error"]["type"] == "authentication_error"
            for path in ("/replicas", "/load", "/v1/models"):
                assert httpx.get(gw.url + path).status_code == 401, path
            served = httpx.post(
                gw.url + "/v1/chat/completions",
                json=chat,
                headers=bearer(GATEWAY_TOKEN),
                timeout=30,
            )
            assert served.status_code == 200, served.text
            assert served.json()["choices"][0]["message"]["content"] == "Hello from the double"

            def replicas() -> dict[str, Any]:
                r = httpx.get(gw.url + "/replicas", headers=bearer(GATEWAY_TOKEN))
                assert r.status_code == 200
                return {x["name"]: x for x in r.json()["replicas"]}

            wait_until(
                lambda: replicas()["gpu"]["command"] is not None, 30, "the gpu replica's command"
            )
            shown = replicas()
    text = json.dumps(shown)
    for secret in SECRETS:
        assert secret not in text, secret
    gpu = shown["gpu"]["command"]
    for name in ("HF_TOKEN", "LICENSE_KEY", VLLM_TOKEN_ENV):
        assert f"{name}='***'" in gpu
    assert "HF_HOME=/var/lib/hf" in gpu
    assert "--api-key '***'" in gpu
    assert shown["remote"]["url"] == "https://***@10.255.0.1:9"
    assert shown["double"]["state"] == "healthy"  # /load scraped with the replica token


def test_launched_replicas_get_the_token_in_their_environment_not_their_argv(
    tmp_path: Path,
) -> None:
    vllm = VllmReplica.model_validate({"name": "v", "model": "m", "gpus": [0]})
    plan = build_plan(vllm, port=9000, model_name="m", run_dir=tmp_path, token="svc-x")
    assert plan.env[VLLM_TOKEN_ENV] == "svc-x"
    assert "svc-x" not in plan.argv
    assert "svc-x" not in plan.shell()

    model = tmp_path / "m.gguf"
    model.write_bytes(b"gguf")
    stand_in = LlamaCppReplica.model_validate({"name": "s", "model_path": str(model)})
    plan = build_plan(stand_in, port=9001, model_name="m", run_dir=tmp_path, token="svc-x")
    assert plan.env[STANDIN_TOKEN_ENV] == "svc-x"
    (config_text,) = plan.files.values()
    assert "svc-x" not in config_text  # the file names the variable, not the value
    assert f"tokens_env: {STANDIN_TOKEN_ENV}" in config_text
    untokened = build_plan(stand_in, port=9001, model_name="m", run_dir=tmp_path)
    assert STANDIN_TOKEN_ENV not in untokened.env
    assert "auth" not in next(iter(untokened.files.values()))


def test_the_gateway_reaches_a_tls_replica_with_its_client_certificate(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    fleet = PrivateCA(tmp_path / "pki")
    served, client = fleet.issue("127.0.0.1"), fleet.issue("central-gateway")
    tls = {
        "ssl_certfile": str(served.cert_file),
        "ssl_keyfile": str(served.key_file),
        "ssl_ca_certs": str(fleet.ca_file),
        "ssl_cert_reqs": ssl.CERT_REQUIRED,  # mTLS: only holders of a fleet certificate
        "loop": "asyncio",
    }
    with UvicornThread(create_double(MODEL, tokens=[REPLICA_TOKEN]), **tls) as double:
        assert double.url.startswith("https://")

        def gateway(**client_settings: Any) -> CentralSettings:
            return CentralSettings.model_validate(
                {
                    "model": MODEL,
                    "replica_client": {"token": REPLICA_TOKEN, **client_settings},
                    "replicas": [
                        {"name": "tls", "kind": "url", "url": double.url, "load_source": "load"}
                    ],
                    "supervision": {
                        "health_interval_s": 0.1,
                        "scrape_interval_s": 0.1,
                        "log_dir": str(tmp_path),
                    },
                }
            )

        trusted = gateway(
            ca_file=str(fleet.ca_file),
            cert_file=str(client.cert_file),
            key_file=str(client.key_file),
        )
        with UvicornThread(create_app(trusted)) as gw:
            wait_ready(gw.url, timeout=60)
            chat = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}]}
            r = httpx.post(gw.url + "/v1/chat/completions", json=chat, timeout=30)
            assert r.status_code == 200, r.text
        # Trusting the system store instead of the fleet CA: never healthy, never plain text.
        with UvicornThread(create_app(gateway())) as gw:
            time.sleep(1.0)
            assert httpx.get(gw.url + "/ready").status_code == 503
            (replica,) = httpx.get(gw.url + "/replicas").json()["replicas"]
            assert replica["state"] != "healthy"
            assert replica["url"].startswith("https://")
    warnings = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    assert any("TLS certificate verification failed" in w for w in warnings), warnings
