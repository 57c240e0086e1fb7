#!/usr/bin/env bash
# Set up (idempotent) and run the main job: the whole local topology (router on
# 127.0.0.1:8080, two edge agents in two regions, the central gateway on the
# CPU stand-in, the rollout controller, one embedded registry). Ctrl-C stops it.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
exec .venv/bin/hybrid-llm up "$@"
