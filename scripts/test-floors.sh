#!/usr/bin/env bash
# Run the registry tests against the OLDEST py-consul that pyproject.toml
# allows, so the floor stays true when newer releases are what a fresh install
# picks. The floor is installed into a throwaway directory that shadows the
# .venv's copy for this one pytest run; .venv itself is not touched.
set -euo pipefail
cd "$(dirname "$0")/.."
floor="$(.venv/bin/python - <<'PY'
import re, tomllib
deps = tomllib.load(open("pyproject.toml", "rb"))["project"]["dependencies"]
(spec,) = [d for d in deps if d.startswith("py-consul")]
print(re.fullmatch(r"py-consul>=([\w.]+)", spec).group(1))
PY
)"
target="$(mktemp -d)"
trap 'rm -rf "$target"' EXIT
.venv/bin/python -m pip install --quiet --no-deps --target "$target" "py-consul==$floor"
got="$(PYTHONPATH="$target" .venv/bin/python -c \
    'import consul, importlib.metadata as m; print(m.version("py-consul"), consul.__file__)')"
case "$got" in
    "$floor $target"/*) echo "py-consul floor: $got" ;;
    *) echo "expected py-consul $floor from $target, got: $got" >&2; exit 1 ;;
esac
PYTHONPATH="$target" .venv/bin/pytest -q -p no:cacheprovider tests/registry
