#!/usr/bin/env bash
# Install the converter tool environments, separate from .venv so that the core's test venv
# never holds the heavy tools:
#   .venv-convert       eliza-backends[convert] + the plugins: torch, transformers, gguf,
#                       mlx-lm, litert-lm-builder, coremltools (runs `bundle convert`)
#   .venv-litert-torch  litert-torch and its closure (requirements-litert-torch.txt): its pins
#                       conflict with the core's, so `bundle convert` runs its exporter there
# Idempotent: skips the install when nothing it depends on changed since the last run.
# --litert-torch-only: only .venv-litert-torch (it needs nothing of .venv's: .ci/run makes it
# while scripts/install.sh compiles llama-cpp-python, which .venv-convert needs).
set -euo pipefail
cd "$(dirname "$0")/.."
litert_only=0
[ "${1:-}" = "--litert-torch-only" ] && litert_only=1
PYTHON=${PYTHON:-python3}
VENV=${CONVERT_VENV:-.venv-convert}
LITERT_VENV=${LITERT_TORCH_VENV:-.venv-litert-torch}
want=$(cat scripts/install-convert.sh constraints-convert.txt requirements-litert-torch.txt \
  pyproject.toml plugins/*/pyproject.toml | sha256sum | cut -d' ' -f1)
stamp="$VENV/.eliza-install-stamp"
if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ] && [ -x "$LITERT_VENV/bin/python" ]; then
  exit 0
fi
[ -x "$LITERT_VENV/bin/python" ] || "$PYTHON" -m venv "$LITERT_VENV"
"$LITERT_VENV/bin/python" -m pip install --quiet --upgrade pip
# torch first and alone, exactly this version: the CPU build (any other spec may pull CUDA)
"$LITERT_VENV/bin/python" -m pip install --quiet "torch==2.13.0"
"$LITERT_VENV/bin/python" -m pip install --quiet -r requirements-litert-torch.txt
[ "$litert_only" -eq 0 ] || exit 0

[ -x "$VENV/bin/python" ] || "$PYTHON" -m venv "$VENV"
"$VENV/bin/python" -m pip install --quiet --upgrade pip
"$VENV/bin/python" -m pip install --quiet "torch==2.13.0"
args=(-e ".[convert]")
for plugin in plugins/*/; do
  args+=(-e "$plugin")
done
"$VENV/bin/python" -m pip install --quiet -c constraints-convert.txt "${args[@]}"
# tell `bundle convert` in .venv-convert where the LiteRT exporter lives
(cd "$LITERT_VENV" && pwd) > "$VENV/eliza-litert-torch-venv"
echo "$want" > "$stamp"
