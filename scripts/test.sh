#!/usr/bin/env bash
# The project's test command: set up (idempotent), then lint, type-check, test.
set -euo pipefail
cd "$(dirname "$0")/.."
# Phoenix too: the trace-store tests run against the real one, not skipped.
scripts/setup.sh --dev --phoenix
.venv/bin/ruff check .
.venv/bin/ruff format --check .
.venv/bin/mypy
.venv/bin/pytest "$@"
# A full run also holds the registry tests to the oldest py-consul we allow.
if [[ $# -eq 0 ]]; then scripts/test-floors.sh; fi
