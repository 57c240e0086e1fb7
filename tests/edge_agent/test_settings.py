from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from edge_agent.settings import EdgeSettings
from servekit.config import ConfigError, load_settings

REPO = Path(__file__).resolve().parents[2]


def test_shipped_config_loads() -> None:
    s = load_settings(EdgeSettings, REPO / "configs" / "edge-local.yaml", **{"server.port": 9})
    assert s.engine.kind == "llama-batching"
    single = load_settings(EdgeSettings, REPO / "configs" / "edge-single.yaml")
    assert single.engine.kind == "llama"
    assert s.server.port == 9
    assert s.engine.model_name == "smollm2-135m-instruct"


@pytest.mark.parametrize(
    ("text", "needle"),
    [
        (
            "engine: {model_path: models/nope.gguf, model_name: x}",
            "engine: Value error, model file",
        ),
        ("server: {port: 99999}\nengine: {model_name: x}", "server.port"),
        ("engine: {model_path: x, model_name: y, n_ctx: -1, bogus: 1}", "engine.llama.n_ctx"),
        ("- just\n- a list", "top level must be a mapping"),
        ("engine: [unclosed", "not valid YAML"),
    ],
)
def test_bad_file_names_path_and_field(tmp_path: Path, text: str, needle: str) -> None:
    cfg = tmp_path / "bad.yaml"
    cfg.write_text(text)
    with pytest.raises(ConfigError) as info:
        load_settings(EdgeSettings, cfg)
    assert str(cfg) in str(info.value)
    assert needle in str(info.value)


def test_cli_fails_at_start_with_clear_message(tmp_path: Path) -> None:
    cfg = tmp_path / "bad.yaml"
    cfg.write_text("engine: {model_path: x.gguf, model_name: m}\nadmission: {max_waiting: -3}\n")
    proc = subprocess.run(
        [sys.executable, "-m", "edge_agent", "serve", "--config", str(cfg)],
        capture_output=True, text=True, cwd=REPO, timeout=60, check=False,
    )  # fmt: skip
    assert proc.returncode == 2
    assert f"{cfg}: admission.max_waiting" in proc.stderr
    assert "Traceback" not in proc.stderr
    missing = subprocess.run(
        [sys.executable, "-m", "edge_agent", "serve", "--config", str(tmp_path / "none.yaml")],
        capture_output=True, text=True, cwd=REPO, timeout=60, check=False,
    )  # fmt: skip
    assert missing.returncode == 2
    assert "cannot read settings file" in missing.stderr


def test_vllm_configs_load_and_build_their_command_lines(tmp_path: Path) -> None:
    from servekit.engine.vllm import VllmEngineSettings, vllm_command

    cpu = load_settings(EdgeSettings, REPO / "configs" / "edge-vllm-cpu.yaml")
    assert cpu.engine.kind == "vllm"
    assert cpu.engine.context_window == 2048
    # The L4 config names its production model directory; point it at a local one.
    model = tmp_path / "qwen2.5-7b-instruct-awq"
    model.mkdir()
    (model / "config.json").write_text("{}")
    l4 = load_settings(
        EdgeSettings, REPO / "configs" / "edge-vllm.yaml", **{"engine.model": str(model)}
    )
    engine = VllmEngineSettings.model_validate(l4.engine.model_dump(exclude={"kind", "swap"}))
    command = vllm_command(engine, 9000)
    argv = command.argv
    assert argv[:3] == ("vllm", "serve", str(model))
    for flag, value in (
        ("--quantization", "awq_marlin"),
        ("--kv-cache-dtype", "fp8"),
        ("--max-model-len", "8192"),
        ("--max-num-seqs", "32"),
        ("--gpu-memory-utilization", "0.45"),
        ("--max-num-batched-tokens", "2048"),
    ):
        assert argv[argv.index(flag) + 1] == value
    assert "--enable-prefix-caching" in argv
    assert "--enable-chunked-prefill" in argv
    assert '"method":"ngram"' in argv[argv.index("--speculative-config") + 1]
    assert command.env["CUDA_VISIBLE_DEVICES"] == "0"
    # Half the card each: a hot swap starts the new server beside the old one.
    assert l4.engine.fits_beside(model)


@pytest.mark.anyio
async def test_a_traced_agent_starts_vllm_exporting_to_its_own_collector() -> None:
    """The agent's `tracing:` block is the one home of the endpoint, for vLLM's spans too."""
    from edge_agent.engines import engine_factory
    from servekit.engine.vllm import VllmEngine

    config = REPO / "configs" / "edge-vllm-cpu.yaml"
    endpoint = "http://127.0.0.1:6006/v1/traces"
    on = {"tracing.enabled": True, "tracing.endpoint": endpoint}
    for settings, traced in (
        (load_settings(EdgeSettings, config, **on), True),
        (load_settings(EdgeSettings, config), False),
    ):
        engine = engine_factory(settings)(settings.engine, "v2")
        assert isinstance(engine, VllmEngine)
        try:
            argv, env = engine.command.argv, engine.command.env
            assert ("--otlp-traces-endpoint" in argv) is traced
            if traced:
                assert argv[argv.index("--otlp-traces-endpoint") + 1] == endpoint
                assert env["OTEL_EXPORTER_OTLP_TRACES_PROTOCOL"] == "http/protobuf"
                assert env["OTEL_TRACES_SAMPLER"] == "parentbased_always_off"
                assert "hybrid_llm.tier=edge" in env["OTEL_RESOURCE_ATTRIBUTES"]
                assert "service.instance.id=edge-vllm-cpu-1" in env["OTEL_RESOURCE_ATTRIBUTES"]
            else:
                assert not any(name.startswith("OTEL_") for name in env)
        finally:
            await engine.aclose()


def test_a_missing_model_directory_fails_at_load(tmp_path: Path) -> None:
    cfg = tmp_path / "edge.yaml"
    cfg.write_text(f"engine: {{kind: vllm, model: {tmp_path / 'nope'}, model_name: x}}")
    with pytest.raises(ConfigError, match=r"has no config\.json"):
        load_settings(EdgeSettings, cfg)
