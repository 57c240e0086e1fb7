"""Turning a replica spec into the exact process the engine needs.

A :class:`LaunchPlan` is everything the supervisor needs to start a replica:
the argv, the environment it adds (``CUDA_VISIBLE_DEVICES`` from the spec's
GPU list), files to write first (trtllm's extra LLM-API options, the
stand-in's config) and how to talk to it once it is up (:class:`Endpoint`).
Building a plan has no side effects, so ``central print-commands`` and the
unit tests see precisely what would run.
"""

from __future__ import annotations

import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, TextIO

import yaml

from central.specs import LlamaCppReplica, TrtllmReplica, UrlReplica, VllmReplica
from servekit.config import deep_merge
from servekit.engine.llama import LlamaSettings
from servekit.engine.process import ProcessCommand
from servekit.engine.vllm_args import VLLM_API_KEY_ENV

if TYPE_CHECKING:
    from central.settings import CentralSettings
    from servekit.tracing import EngineTraces

__all__ = [
    "Endpoint",
    "LaunchPlan",
    "LoadSource",
    "build_plan",
    "endpoint_for_url",
    "llama_settings",
    "llamacpp_plan",
    "print_commands",
    "trtllm_plan",
    "vllm_plan",
]

LoadSource = Literal["vllm", "trtllm", "load", "none"]

# Where a launched replica finds the gateway's service token: the environment,
# never the command line (``ps`` shows that to every user of the host).
VLLM_TOKEN_ENV = VLLM_API_KEY_ENV  # `vllm serve` checks it on /v1 routes
STANDIN_TOKEN_ENV = "HYBRID_LLM_SERVICE_TOKEN"

# trtllm-serve's /metrics handler gathers `get_stats_async(2)`: it returns after a
# 2-second quiet gap when the engine has nothing new (openai_server.get_iteration_stats).
_TRTLLM_STATS_WAIT_S = 2.0


@dataclass(frozen=True, slots=True)
class Endpoint:
    """How the gateway talks to a running replica."""

    base_url: str
    upstream_model: str
    capacity: int
    load_source: LoadSource
    health_path: str = "/health"
    send_priority: bool = False
    can_continue: bool = True
    # trtllm-serve: a 400 may be an engine failure; priority is a float in 0..1, higher
    # first; its JSON /metrics waits ~2 s for iteration stats (a slower, longer scrape).
    trtllm: bool = False

    @property
    def load_timeout_s(self) -> float | None:
        """How long a load scrape may take (None: the gateway's probe timeout)."""
        return _TRTLLM_STATS_WAIT_S + 3.0 if self.trtllm else None

    @property
    def load_interval_s(self) -> float | None:
        """The least time between two load scrapes (None: the gateway's interval)."""
        return _TRTLLM_STATS_WAIT_S + 1.0 if self.trtllm else None


@dataclass(frozen=True, slots=True)
class LaunchPlan:
    """A replica's process (the shared :class:`ProcessCommand`) and how to reach it."""

    argv: tuple[str, ...]
    endpoint: Endpoint
    env: Mapping[str, str] = field(default_factory=dict)
    files: Mapping[Path, str] = field(default_factory=dict)

    @property
    def command(self) -> ProcessCommand:
        return ProcessCommand(self.argv, self.env, self.files)

    def shell(self) -> str:
        """The plan as one shell line (environment first), secret values shown as ``***``."""
        return self.command.shell()


def _url(host: str, port: int) -> str:
    # A replica bound to all interfaces is still reached over loopback.
    reach = "127.0.0.1" if host in ("0.0.0.0", "::", "") else host
    return f"http://{reach}:{port}"


def _gpu_env(gpus: list[int], extra: Mapping[str, str]) -> dict[str, str]:
    env = {"CUDA_VISIBLE_DEVICES": ",".join(str(g) for g in gpus)}
    env.update(extra)
    return env


def vllm_plan(
    spec: VllmReplica,
    *,
    port: int,
    model_name: str,
    token: str | None = None,
    traces: EngineTraces | None = None,
    kv_events: Sequence[str] = (),
) -> LaunchPlan:
    """``kv_events``: the flags that publish its KV-cache events (its prefix report's)."""
    served = spec.served_model_name or model_name
    argv = spec.serve_argv(spec.model, host=spec.host, port=port, served=served, traces=traces)
    argv += kv_events
    endpoint = Endpoint(
        _url(spec.host, port), served, spec.capacity, "vllm", send_priority=spec.sends_priority
    )
    env = spec.serve_env(traces)
    env.update(spec.env)
    if token is not None:
        env[VLLM_TOKEN_ENV] = token
    return LaunchPlan(tuple(argv), endpoint, env)


def trtllm_options(spec: TrtllmReplica) -> dict[str, Any]:
    """The extra LLM-API options file's content for a trtllm replica."""
    opts: dict[str, Any] = {}
    if spec.backend == "pytorch":
        # The /metrics endpoint only has iteration stats when these are collected.
        opts["enable_iter_perf_stats"] = True
    kv: dict[str, Any] = {}
    if spec.kv_cache_free_gpu_memory_fraction is not None:
        # In the file, not as --kv_cache_free_gpu_memory_fraction: older trtllm-serve
        # drops the flag when the options file has a kv_cache_config of its own.
        kv["free_gpu_memory_fraction"] = spec.kv_cache_free_gpu_memory_fraction
    if spec.kv_cache_dtype is not None:
        kv["dtype"] = spec.kv_cache_dtype
    if spec.enable_prefix_caching is not None:
        kv["enable_block_reuse"] = spec.enable_prefix_caching
    if kv:
        opts["kv_cache_config"] = kv
    if spec.enable_chunked_prefill is not None:
        opts["enable_chunked_prefill"] = spec.enable_chunked_prefill
    return deep_merge(opts, spec.extra_llm_api_options)


def trtllm_plan(spec: TrtllmReplica, *, port: int, run_dir: Path) -> LaunchPlan:
    options_file = run_dir / f"{spec.name}.extra-llm-api-options.yaml"
    argv: list[str] = [spec.executable, spec.model]
    argv += ["--host", spec.host, "--port", str(port), "--backend", spec.backend]
    argv += ["--tp_size", str(spec.tp_size), "--pp_size", str(spec.pp_size)]
    if spec.ep_size is not None:
        argv += ["--ep_size", str(spec.ep_size)]
    if spec.max_batch_size is not None:
        argv += ["--max_batch_size", str(spec.max_batch_size)]
    if spec.max_num_tokens is not None:
        argv += ["--max_num_tokens", str(spec.max_num_tokens)]
    if spec.max_seq_len is not None:
        argv += ["--max_seq_len", str(spec.max_seq_len)]
    if spec.trust_remote_code:
        argv.append("--trust_remote_code")
    argv += ["--extra_llm_api_options", str(options_file)]
    argv += spec.extra_args
    files = {options_file: yaml.safe_dump(trtllm_options(spec), sort_keys=True)}
    # trtllm-serve names the model after the path it was given. Its chat API is
    # not known to take continue_final_message, so answers are not resumed on it.
    endpoint = Endpoint(
        _url(spec.host, port),
        spec.model,
        spec.capacity,
        "trtllm",
        send_priority=spec.send_priority,
        can_continue=False,
        trtllm=True,
    )
    return LaunchPlan(tuple(argv), endpoint, _gpu_env(spec.gpus, spec.env), files)


def llamacpp_settings(
    spec: LlamaCppReplica, *, port: int, model_name: str, version: str, token: bool = False
) -> dict[str, Any]:
    """The edge-agent settings that make it a plain stand-in replica.

    It answers to the gateway's model name, accepts no aliases and keeps a
    small queue of its own: the gateway's queue is where priorities apply.
    With ``token`` it accepts the gateway's service token from its environment.
    """
    engine: dict[str, Any] = {"kind": "llama", **_llama_fields(spec, model_name)}
    if spec.slots > 1:
        engine["kind"] = "llama-batching"
        engine["slots"] = spec.slots
        engine["ctx_per_slot"] = engine.pop("n_ctx")
    server: dict[str, Any] = {"host": spec.host, "port": port, "log_level": "warning"}
    if token:
        server["auth"] = {"tokens_env": STANDIN_TOKEN_ENV}
    base: dict[str, Any] = {
        "server": server,
        "instance": {"id": f"central-{spec.name}", "region": "center", "version": version},
        "engine": engine,
        "admission": {"max_waiting": spec.max_waiting},
        "aliases": [],
    }
    return deep_merge(base, spec.edge_settings)


def _llama_fields(spec: LlamaCppReplica, model_name: str) -> dict[str, Any]:
    fields: dict[str, Any] = {
        "model_path": str(spec.model_path.resolve()),
        "model_name": model_name,
        "n_ctx": spec.n_ctx,
    }
    if spec.n_threads is not None:
        fields["n_threads"] = spec.n_threads
    return fields


def llama_settings(spec: LlamaCppReplica, *, model_name: str) -> LlamaSettings:
    """Settings of the in-process engine for an ``inprocess`` stand-in."""
    engine = dict(spec.edge_settings.get("engine") or {})
    engine.pop("kind", None)
    return LlamaSettings.model_validate(deep_merge(_llama_fields(spec, model_name), engine))


def llamacpp_plan(
    spec: LlamaCppReplica,
    *,
    port: int,
    model_name: str,
    run_dir: Path,
    python: str,
    version: str = "",
    token: str | None = None,
) -> LaunchPlan:
    config_file = run_dir / f"{spec.name}.edge-agent.yaml"
    settings = llamacpp_settings(
        spec, port=port, model_name=model_name, version=version or "v1", token=token is not None
    )
    argv = [python, "-m", "edge_agent", "serve", "--config", str(config_file)]
    argv += ["--host", spec.host, "--port", str(port)]
    endpoint = Endpoint(_url(spec.host, port), model_name, spec.capacity, "load", "/ready")
    files = {config_file: yaml.safe_dump(settings, sort_keys=True)}
    env = dict(spec.env)
    if token is not None:
        env[STANDIN_TOKEN_ENV] = token
    return LaunchPlan(tuple(argv), endpoint, env, files)


def build_plan(
    spec: VllmReplica | TrtllmReplica | LlamaCppReplica,
    *,
    port: int,
    model_name: str,
    run_dir: Path,
    python: str = sys.executable,
    version: str = "",
    token: str | None = None,
    traces: EngineTraces | None = None,
    kv_events: Sequence[str] = (),
) -> LaunchPlan:
    """The launch plan for any launched replica kind (``kv_events``: a vLLM replica's
    event flags, :func:`vllm_plan`).

    ``token`` (the gateway's ``replica_client.token``) goes into the replica's
    environment so it accepts only the gateway: vLLM's ``VLLM_API_KEY``, the
    stand-in's ``server.auth``. trtllm-serve has no API-key check; keep it on
    a loopback or private address. ``traces`` (the gateway's tracing) makes a
    vLLM replica export its own spans to the same collector.
    """
    if isinstance(spec, VllmReplica):
        return vllm_plan(
            spec, port=port, model_name=model_name, token=token, traces=traces, kv_events=kv_events
        )
    if isinstance(spec, TrtllmReplica):
        return trtllm_plan(spec, port=port, run_dir=run_dir)
    return llamacpp_plan(
        spec,
        port=port,
        model_name=model_name,
        run_dir=run_dir,
        python=python,
        version=version,
        token=token,
    )


def endpoint_for_url(spec: UrlReplica, *, model_name: str) -> Endpoint:
    return Endpoint(
        spec.url.rstrip("/"),
        spec.upstream_model or model_name,
        spec.capacity,
        spec.load_source,
        spec.health_path,
        spec.send_priority,
        spec.can_continue,
        trtllm=spec.load_source == "trtllm",
    )


def _num(value: float) -> str:
    return format(value, "g")


def print_commands(settings: CentralSettings, out: TextIO) -> None:
    """Write each replica's command line (and generated files) for an operator."""
    run_dir = settings.supervision.log_dir
    traces = settings.engine_traces()
    for spec in settings.replicas:
        out.write(f"# {spec.name} ({spec.kind})\n")
        if isinstance(spec, UrlReplica):
            out.write(f"# already running at {spec.url}; probed, not launched\n\n")
            continue
        if isinstance(spec, LlamaCppReplica) and spec.mode == "inprocess":
            out.write(f"# in-process llama.cpp engine in the gateway: {spec.model_path}\n\n")
            continue
        if not spec.port:
            out.write("# port 0: a free port is picked when the gateway starts\n")
        plan = build_plan(
            spec, port=spec.port, model_name=settings.model, run_dir=run_dir,
            version=settings.version, traces=traces,
        )  # fmt: skip
        for path, content in plan.files.items():
            out.write(f"# writes {path}:\n")
            out.writelines(f"#   {line}\n" for line in content.splitlines())
        out.write(plan.shell() + "\n\n")
