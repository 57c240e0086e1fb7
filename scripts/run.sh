#!/usr/bin/env bash
# Set up (idempotent) and run the main job on 127.0.0.1:8080.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
exec .venv/bin/edge-agent serve --config configs/edge-local.yaml --port 8080 "$@"
