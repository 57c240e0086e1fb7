"""Secret settings from files and environment variables; redaction of what must not show."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
from pydantic import SecretStr

from servekit.config import ConfigError, load_settings
from servekit.peers import PeerSettings
from servekit.secrets import (
    RedactingFilter,
    redact_argv,
    redact_env,
    redact_text,
    redact_url,
    strip_url_credentials,
)
from servekit.service_auth import ServiceAuthSettings, hash_token


def write(path: Path, text: str) -> Path:
    path.write_text(text, encoding="utf-8")
    return path


def test_a_secret_comes_from_a_file_named_with_the_credentials_directory(tmp_path: Path) -> None:
    creds = tmp_path / "creds"
    creds.mkdir()
    write(creds / "service-token", "tok-from-file\n")
    cfg = write(tmp_path / "peer.yaml", "token_file: $CREDENTIALS_DIRECTORY/service-token\n")
    peer = load_settings(PeerSettings, cfg, {"CREDENTIALS_DIRECTORY": str(creds)})
    assert isinstance(peer.token, SecretStr)
    assert peer.token.get_secret_value() == "tok-from-file"  # trailing newline stripped
    assert "tok-from-file" not in repr(peer)


def test_a_secret_comes_from_an_environment_variable(tmp_path: Path) -> None:
    cfg = write(tmp_path / "peer.yaml", "token_env: EDGE_TOKEN\n")
    peer = load_settings(PeerSettings, cfg, {"EDGE_TOKEN": "tok-from-env"})
    assert peer.token is not None
    assert peer.token.get_secret_value() == "tok-from-env"
    headers = peer.credentials().headers
    assert headers == {"authorization": "Bearer tok-from-env"}


def test_a_token_list_from_a_file_one_per_line_and_from_env_separated(tmp_path: Path) -> None:
    tokens = write(tmp_path / "tokens", "# rotating: new first\nnew-token\n\nold-token\n")
    cfg = write(tmp_path / "auth.yaml", f"tokens_file: {tokens}\n")
    auth = load_settings(ServiceAuthSettings, cfg)
    assert auth.digests() == [hash_token("new-token"), hash_token("old-token")]
    cfg = write(tmp_path / "auth2.yaml", "tokens_env: TOKENS\nsha256: [" + "a" * 64 + "]\n")
    auth = load_settings(ServiceAuthSettings, cfg, {"TOKENS": "one, two"})
    assert auth.digests() == [hash_token("one"), hash_token("two"), "a" * 64]


@pytest.mark.parametrize(
    ("yaml", "environ", "message"),
    [
        ("token_file: /nonexistent/token\n", {}, "token_file: cannot read /nonexistent/token"),
        ("token_env: NOT_SET\n", {}, "token_env: environment variable NOT_SET is not set"),
        ("token: a\ntoken_env: B\n", {"B": "b"}, "give only one of token, token_env"),
        ("token_file: $NOPE/x\n", {}, "token_file: $NOPE is not set"),
        ("token_env: EMPTY\n", {"EMPTY": "  "}, "token_env: it is empty"),
    ],
)
def test_a_secret_that_cannot_be_had_fails_at_load_naming_file_and_field(
    tmp_path: Path, yaml: str, environ: dict[str, str], message: str
) -> None:
    cfg = write(tmp_path / "peer.yaml", yaml)
    with pytest.raises(ConfigError) as err:
        load_settings(PeerSettings, cfg, environ)
    assert str(cfg) in str(err.value)
    assert message in str(err.value)


def test_nested_sections_resolve_their_secrets_too(tmp_path: Path) -> None:
    from central.settings import ServerSettings

    tokens = write(tmp_path / "tokens", "gateway-token\n")
    cfg = write(tmp_path / "server.yaml", f"port: 9\nauth: {{tokens_file: {tokens}}}\n")
    server = load_settings(ServerSettings, cfg)
    assert server.auth.digests() == [hash_token("gateway-token")]


def test_environment_values_of_secret_names_are_hidden() -> None:
    env = {
        "CUDA_VISIBLE_DEVICES": "0,1",
        "HF_TOKEN": "hf_abc",
        "HUGGING_FACE_HUB_TOKEN": "hf_def",
        "NGC_API_KEY": "nvapi-1",
        "AWS_SECRET_ACCESS_KEY": "aws-2",
        "VLLM_API_KEY": "svc-3",
        "LICENSE_KEY": "lic-4",
        "HF_HOME": "/var/lib/hf",
        "PROXY": "http://bob:hunter2@proxy:3128",
    }
    shown = redact_env(env)
    assert shown["CUDA_VISIBLE_DEVICES"] == "0,1"
    assert shown["HF_HOME"] == "/var/lib/hf"
    assert shown["PROXY"] == "http://***@proxy:3128"
    for name in ("HF_TOKEN", "HUGGING_FACE_HUB_TOKEN", "NGC_API_KEY", "AWS_SECRET_ACCESS_KEY"):
        assert shown[name] == "***"
    assert not {"hf_abc", "hf_def", "nvapi-1", "aws-2", "svc-3", "lic-4", "hunter2"} & set(
        shown.values()
    )


def test_secret_flags_are_hidden_on_a_command_line_and_others_kept() -> None:
    argv = ["vllm", "serve", "m", "--api-key", "k1", "--hf-token=k2", "--max-num-batched-tokens",
            "8192", "--tokenizer", "tok/path", "--download-dir", "s3://u:pw@bucket/x"]  # fmt: skip
    assert redact_argv(argv) == [
        "vllm", "serve", "m", "--api-key", "***", "--hf-token=***", "--max-num-batched-tokens",
        "8192", "--tokenizer", "tok/path", "--download-dir", "s3://***@bucket/x",
    ]  # fmt: skip


def test_urls_lose_user_password_and_query_tokens() -> None:
    url = "https://bob:hunter2@store.example/m/v2.gguf?X-Amz-Signature=abc&X-Amz-Date=1&token=t"
    shown = redact_url(url)
    assert "hunter2" not in shown
    assert "abc" not in shown
    assert "=t" not in shown
    assert shown.startswith("https://***@store.example/m/v2.gguf?")
    assert "X-Amz-Date=1" in shown
    stripped = strip_url_credentials(url)
    assert stripped == "https://store.example/m/v2.gguf?X-Amz-Date=1"
    plain = "http://127.0.0.1:8600/smollm2-v2.gguf"
    assert redact_url(plain) == plain == strip_url_credentials(plain)


def test_free_text_and_log_records_hide_credentials() -> None:
    text = "GET https://u:p4ss@h/x?access_token=zzz&n=1 failed; Authorization: Bearer svc-secret"
    clean = redact_text(text)
    assert "p4ss" not in clean
    assert "zzz" not in clean
    assert "svc-secret" not in clean
    assert "n=1" in clean
    assert "https://***@h/x" in clean

    record = logging.LogRecord("t", logging.WARNING, __file__, 1, "fetch %s: %s", None, None)
    record.args = ("https://u:p4ss@h/file", "boom")
    assert RedactingFilter().filter(record)
    assert record.getMessage() == "fetch https://***@h/file: boom"
