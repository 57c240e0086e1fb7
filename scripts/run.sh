#!/usr/bin/env bash
# Set up (idempotent) and run the main job: the whole local topology (router on
# 127.0.0.1:8080, two edge agents in two regions, the central gateway on the
# CPU stand-in, the rollout controller, one embedded registry). Ctrl-C stops it.
# `scripts/run.sh --center vllm` runs the center on two real vLLM replicas (the
# production engine; the first setup installs vLLM for CPU, a few minutes).
# `scripts/run.sh --tracing` also runs Arize Phoenix, the trace store every
# service exports to (the first setup installs it, about 2 minutes).
set -euo pipefail
cd "$(dirname "$0")/.."
setup=()
prev=""
for arg in "$@" ""; do
    if [[ "$arg" == "--center=vllm" || ( "$prev" == "--center" && "$arg" == "vllm" ) ]]; then
        setup+=(--vllm)
    fi
    # --tracing alone (or `local`) is the local trace store; --tracing URL is someone else's.
    if [[ "$arg" == "--tracing=local" || ( "$prev" == "--tracing" && "$arg" != *://* ) ]]; then
        setup+=(--phoenix)
    fi
    prev="$arg"
done
scripts/setup.sh "${setup[@]}"
exec .venv/bin/hybrid-llm up "$@"
