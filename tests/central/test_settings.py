"""Configs asking for what an engine cannot do fail at load, naming file and field."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from central.settings import load
from servekit.config import ConfigError

CONFIGS = Path(__file__).resolve().parents[2] / "configs"


def _vllm(**over: Any) -> dict[str, Any]:
    base: dict[str, Any] = {"name": "a", "kind": "vllm", "model": "m", "gpus": [0, 1, 2, 3]}
    base["tensor_parallel_size"] = 4
    base.update(over)
    return base


def _write(tmp_path: Path, replicas: list[dict[str, Any]]) -> Path:
    path = tmp_path / "central.yaml"
    path.write_text(yaml.safe_dump({"model": "big", "replicas": replicas}))
    return path


def _error(tmp_path: Path, replicas: list[dict[str, Any]]) -> str:
    path = _write(tmp_path, replicas)
    with pytest.raises(ConfigError) as info:
        load(path)
    message = str(info.value)
    assert str(path) in message
    return message


@pytest.mark.parametrize(
    "name", ["central-h100-vllm.yaml", "central-h100-trtllm.yaml", "central-cpu.yaml"]
)
def test_example_configs_load(name: str) -> None:
    settings = load(CONFIGS / name)
    assert len(settings.replicas) == 2


def test_tensor_parallel_larger_than_the_gpus_listed(tmp_path: Path) -> None:
    message = _error(tmp_path, [_vllm(tensor_parallel_size=8)])
    assert "replicas.0.vllm" in message
    assert "tensor_parallel_size × pipeline_parallel_size = 8 GPUs but gpus lists 4" in message


def test_pipeline_parallel_counts_too(tmp_path: Path) -> None:
    message = _error(tmp_path, [_vllm(pipeline_parallel_size=2)])
    assert "= 8 GPUs but gpus lists 4" in message


def test_trtllm_parallelism_must_match_gpus(tmp_path: Path) -> None:
    spec = {"name": "t", "kind": "trtllm", "model": "m", "gpus": [0, 1], "tp_size": 4}
    assert "tp_size × pp_size = 4 GPUs but gpus lists 2" in _error(tmp_path, [spec])


def test_unknown_quantization(tmp_path: Path) -> None:
    message = _error(tmp_path, [_vllm(quantization="int3")])
    assert "replicas.0.vllm.quantization" in message
    assert "'fp8'" in message
    assert "'awq'" in message


def test_unknown_kv_cache_dtype(tmp_path: Path) -> None:
    assert "kv_cache_dtype" in _error(tmp_path, [_vllm(kv_cache_dtype="int4")])


def test_unknown_replica_kind(tmp_path: Path) -> None:
    message = _error(tmp_path, [{"name": "x", "kind": "sglang"}])
    assert "replicas.0" in message
    assert "'vllm'" in message


def test_misspelled_engine_argument_is_rejected(tmp_path: Path) -> None:
    assert "max_num_seq" in _error(tmp_path, [_vllm(max_num_seq=8)])


def test_batch_budget_must_hold_a_whole_prompt_without_chunked_prefill(tmp_path: Path) -> None:
    spec = _vllm(enable_chunked_prefill=False, max_num_batched_tokens=2048, max_model_len=8192)
    message = _error(tmp_path, [spec])
    assert "max_num_batched_tokens (2048) must be >= max_model_len (8192)" in message
    # With chunked prefill the same budget is a chunk size, which is the point.
    ok = _write(tmp_path, [{**spec, "enable_chunked_prefill": True}])
    assert load(ok).replicas[0].kind == "vllm"


def test_batch_budget_below_max_num_seqs(tmp_path: Path) -> None:
    message = _error(tmp_path, [_vllm(max_num_batched_tokens=64, max_num_seqs=256)])
    assert "max_num_batched_tokens (64) must be >= max_num_seqs (256)" in message


def test_speculative_needs_a_draft_model(tmp_path: Path) -> None:
    spec = _vllm(speculative={"method": "draft_model", "num_speculative_tokens": 3})
    assert "draft_model speculation needs a draft model" in _error(tmp_path, [spec])


def test_gpu_memory_utilization_is_a_fraction(tmp_path: Path) -> None:
    assert "gpu_memory_utilization" in _error(tmp_path, [_vllm(gpu_memory_utilization=1.5)])


def test_a_gpu_cannot_serve_two_replicas(tmp_path: Path) -> None:
    second = _vllm(name="b", gpus=[3, 4, 5, 6])
    assert "GPU 3 on 127.0.0.1 is given to both a and b" in _error(tmp_path, [_vllm(), second])


def test_replica_names_are_unique(tmp_path: Path) -> None:
    second = _vllm(gpus=[4, 5, 6, 7])
    assert "replica names must be unique: ['a']" in _error(tmp_path, [_vllm(), second])


def test_cpu_thread_groups_must_match_the_ranks(tmp_path: Path) -> None:
    spec = {"name": "a", "kind": "vllm", "model": "m", "cpu_threads_bind": "0|1"}
    assert "cpu_threads_bind lists 2 core groups but the engine has 1 ranks" in _error(
        tmp_path, [spec]
    )


@pytest.mark.parametrize("draft_tp", [1, 4])
def test_draft_tensor_parallel_is_one_or_the_targets(tmp_path: Path, draft_tp: int) -> None:
    speculative = {
        "model": "d",
        "num_speculative_tokens": 3,
        "draft_tensor_parallel_size": draft_tp,
    }
    spec = _vllm(gpus=[0, 1, 2, 3], tensor_parallel_size=4, speculative=speculative)
    _write(tmp_path, [spec])
    assert load(tmp_path / "central.yaml").replicas[0].kind == "vllm"


def test_draft_tensor_parallel_between_one_and_the_targets_is_refused(tmp_path: Path) -> None:
    """vLLM's SpeculativeConfig accepts 1 or the target's size only (not 2 of 4)."""
    speculative = {"model": "d", "num_speculative_tokens": 3, "draft_tensor_parallel_size": 2}
    spec = _vllm(gpus=[0, 1, 2, 3], tensor_parallel_size=4, speculative=speculative)
    assert "must be 1 or tensor_parallel_size (4)" in _error(tmp_path, [spec])


def test_cli_overrides_apply(tmp_path: Path) -> None:
    settings = load(CONFIGS / "central-cpu.yaml", **{"server.port": 9999})
    assert settings.server.port == 9999
