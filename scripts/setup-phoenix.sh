#!/usr/bin/env bash
# Install Arize Phoenix (an OpenTelemetry trace store with a web UI, on SQLite)
# into its own virtualenv, once per machine, and link it as .phoenix/.
# `hybrid-llm up --tracing` runs it as the local topology's trace backend
# (`.phoenix/bin/python -m phoenix.server.main serve`); nothing of it enters
# .venv/ (its pins: SQLAlchemy, grpcio, pandas, strawberry... are its own).
# Cache root: $HYBRID_LLM_PHOENIX_CACHE, else $HYBRID_LLM_CACHE/phoenix, else
# ~/.cache/hybrid-llm/phoenix. Concurrent setups on one machine wait on a lock.
set -euo pipefail
cd "$(dirname "$0")/.."

VERSION="${PHOENIX_VERSION:-20.26.1}"
PY="${PYTHON:-python3}"
ROOT="${HYBRID_LLM_PHOENIX_CACHE:-${HYBRID_LLM_CACHE:-$HOME/.cache/hybrid-llm}/phoenix}"
ENV_DIR="$ROOT/arize-phoenix-$VERSION"
PIP_QUIET=(--quiet --no-warn-script-location)

mkdir -p "$ROOT"
exec 9>"$ROOT/.lock"

install_env() {
    echo "installing arize-phoenix $VERSION into $ENV_DIR (a minute or two)" >&2
    rm -rf "$ENV_DIR"
    "$PY" -m venv "$ENV_DIR"
    local pip=("$ENV_DIR/bin/python" -m pip)
    "${pip[@]}" install "${PIP_QUIET[@]}" --upgrade pip >&2
    "${pip[@]}" install "${PIP_QUIET[@]}" "arize-phoenix==$VERSION" >&2
    # The server module `hybrid-llm up` runs must import.
    "$ENV_DIR/bin/python" -c "import phoenix.server.main" >&2
    touch "$ENV_DIR/.complete"
}

if [[ ! -f "$ENV_DIR/.complete" ]]; then
    flock 9
    [[ -f "$ENV_DIR/.complete" ]] || install_env
    flock -u 9
fi
ln -sfn "$ENV_DIR" .phoenix
echo "Arize Phoenix $VERSION: .phoenix/bin/python -m phoenix.server.main serve" >&2
