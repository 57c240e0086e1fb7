#!/usr/bin/env bash
# Set up the project on a fresh machine: .venv/, the portable llama.cpp build,
# the project itself (editable), and the bundled GGUF model under models/.
#   scripts/setup.sh          runtime only
#   scripts/setup.sh --dev    plus the test and lint tools
set -euo pipefail
cd "$(dirname "$0")/.."

EXTRAS="edge"
if [[ "${1:-}" == "--dev" ]]; then EXTRAS="edge,dev"; fi

PY="${PYTHON:-python3}"
if [[ ! -x .venv/bin/python ]]; then
    "$PY" -m venv .venv
fi
.venv/bin/python -m pip install --quiet --upgrade pip setuptools wheel

wheel="$(PYTHON=.venv/bin/python scripts/build-llama-wheel.sh)"
.venv/bin/python -m pip install --quiet "$wheel"
.venv/bin/python -m pip install --quiet -e ".[$EXTRAS]"

.venv/bin/hybrid-llm fetch-models
