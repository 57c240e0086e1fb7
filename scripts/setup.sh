#!/usr/bin/env bash
# Set up the project on a fresh machine: .venv/, the portable llama.cpp build,
# the project itself (editable), the bundled GGUF model under models/ and,
# with --dev or --vllm, vLLM for CPU in its own environment (.vllm/) plus the
# HF-layout model directory it serves (scripts/setup-vllm.sh).
#   scripts/setup.sh            the services, OpenTelemetry tracing, the tools (bench,
#                               simulator, plots) and the model
#   scripts/setup.sh --vllm     runtime plus vLLM (a local topology centred on vLLM)
#   scripts/setup.sh --phoenix  runtime plus Arize Phoenix in its own environment
#                               (.phoenix/), the trace store of `hybrid-llm up --tracing`
#                               (scripts/setup-phoenix.sh; about 2 minutes the first time)
#   scripts/setup.sh --dev      plus the test and lint tools, vLLM for its tests and
#                               Redis for the shared-limits tests (scripts/setup-redis.sh);
#                               (scripts/test.sh adds --phoenix, so its tests run too)
set -euo pipefail
cd "$(dirname "$0")/.."

EXTRAS="edge,tools,tracing"
VLLM=0
PHOENIX=0
for arg in "$@"; do
    case "$arg" in
        --dev) EXTRAS="edge,tools,tracing,dev"; VLLM=1 ;;
        --vllm) VLLM=1 ;;
        --phoenix) PHOENIX=1 ;;
        *) echo "setup.sh: unknown option $arg" >&2; exit 2 ;;
    esac
done

PY="${PYTHON:-python3}"
if [[ ! -x .venv/bin/python ]]; then
    "$PY" -m venv .venv
fi
.venv/bin/python -m pip install --quiet --upgrade pip setuptools wheel

wheel="$(PYTHON=.venv/bin/python scripts/build-llama-wheel.sh)"
.venv/bin/python -m pip install --quiet "$wheel"
.venv/bin/python -m pip install --quiet -e ".[$EXTRAS]"

.venv/bin/hybrid-llm fetch-models

if [[ "$VLLM" == 1 ]]; then
    PYTHON="$PY" scripts/setup-vllm.sh
fi

if [[ "$PHOENIX" == 1 ]]; then
    PYTHON="$PY" scripts/setup-phoenix.sh
fi

if [[ "$EXTRAS" == *dev* ]]; then
    scripts/setup-redis.sh
fi
