#!/usr/bin/env bash
# Build (once per machine) a portable llama-cpp-python wheel and print its path.
#
# pip's own wheel cache ignores CMAKE_ARGS, and a default build uses
# -march=native, which has crashed here with "Illegal instruction". So we
# build with an explicit, portable instruction set into our own cache folder,
# keyed by version and flags, and reuse it on later runs.
set -euo pipefail

VERSION="${LLAMA_CPP_PYTHON_VERSION:-0.3.36}"
FLAGS="${LLAMA_CMAKE_ARGS:--DGGML_NATIVE=OFF -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON}"
KEY="$(printf '%s %s' "$VERSION" "$FLAGS" | sha256sum | cut -c1-12)"
CACHE="${HYBRID_LLM_CACHE:-$HOME/.cache/hybrid-llm}/wheels/llama-cpp-python-$VERSION-$KEY"
PY="${PYTHON:-python3}"

existing="$(ls "$CACHE"/llama_cpp_python-"$VERSION"-*.whl 2>/dev/null | head -n1 || true)"
if [[ -n "$existing" ]]; then
    echo "$existing"
    exit 0
fi

mkdir -p "$CACHE"
# Concurrent setups on one machine wait for one build instead of racing.
exec 9>"$CACHE/.lock"
flock 9
existing="$(ls "$CACHE"/llama_cpp_python-"$VERSION"-*.whl 2>/dev/null | head -n1 || true)"
if [[ -n "$existing" ]]; then
    echo "$existing"
    exit 0
fi
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
echo "building llama-cpp-python $VERSION (portable: $FLAGS); this takes 10-16 minutes on 2 cores" >&2
CMAKE_ARGS="$FLAGS" CMAKE_BUILD_PARALLEL_LEVEL="$(nproc)" \
    "$PY" -m pip wheel --no-deps --no-cache-dir -w "$tmp" "llama-cpp-python==$VERSION" >&2
mv "$tmp"/llama_cpp_python-*.whl "$CACHE"/
ls "$CACHE"/llama_cpp_python-"$VERSION"-*.whl | head -n1
