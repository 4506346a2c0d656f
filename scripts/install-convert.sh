#!/usr/bin/env bash
# Install the converter tool environments, separate from .venv so that the core's test venv
# never holds the heavy tools:
#   .venv-convert       eliza-backends[convert] + the plugins: torch, transformers, gguf,
#                       mlx-lm, litert-lm-builder, coremltools (runs `bundle convert`), and
#                       llama.cpp's convert_hf_to_gguf.py from the llama-cpp-python sdist
#                       (share/llama.cpp-convert/)
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
# llama.cpp's own convert_hf_to_gguf.py (Gemma 4 and its MTP assistant are written by it), with
# its conversion/ and gguf-py/, from the sdist of the llama-cpp-python installed here (pip's
# cache holds it after the compile); recorded for `bundle convert`
llama_ver=$("$VENV/bin/python" -c "import importlib.metadata as m; print(m.version('llama-cpp-python'))")
sdist=$(mktemp -d)
"$VENV/bin/python" -m pip download --quiet --no-deps --no-binary :all: \
  "llama-cpp-python==$llama_ver" -d "$sdist"
"$VENV/bin/python" - "$sdist"/llama_cpp_python-*.tar.gz "$VENV/share/llama.cpp-convert" <<'PY'
import shutil, sys, tarfile
from pathlib import Path
out = Path(sys.argv[2])
shutil.rmtree(out, ignore_errors=True)
keep = ("convert_hf_to_gguf.py", "conversion/", "gguf-py/", "LICENSE")
with tarfile.open(sys.argv[1]) as tar:
    for m in tar.getmembers():
        parts = m.name.split("/vendor/llama.cpp/", 1)
        if len(parts) == 2 and parts[1].startswith(keep) and (m.isfile() or m.isdir()):
            m.name = parts[1]
            tar.extract(m, out, filter="data")
assert (out / "convert_hf_to_gguf.py").is_file(), "no convert_hf_to_gguf.py in the sdist"
PY
rm -rf "$sdist"
echo "$(cd "$VENV/share/llama.cpp-convert" && pwd)/convert_hf_to_gguf.py" \
  > "$VENV/eliza-llama-cpp-converter"
echo "$want" > "$stamp"
