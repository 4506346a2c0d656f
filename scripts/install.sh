#!/usr/bin/env bash
# Install the core, every plugin under plugins/ (editable) and the dev tools into .venv.
# Idempotent: skips the install when nothing it depends on changed since the last run.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
VENV=${VENV:-.venv}
[ -x "$VENV/bin/python" ] || "$PYTHON" -m venv "$VENV"
stamp="$VENV/.eliza-install-stamp"
want=$(cat scripts/install.sh constraints.txt pyproject.toml plugins/*/pyproject.toml | sha256sum | cut -d' ' -f1)
if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ]; then
  exit 0
fi
"$VENV/bin/python" -m pip install --quiet --upgrade pip
# the dev tools are a PEP 735 dependency group (pip >= 25.1, upgraded above), not an extra
args=(--group dev -e ".[server,structured,ray,media]")
for plugin in plugins/*/; do
  args+=(-e "$plugin")
done
# llama-cpp-python compiles from source on first install (about 6 minutes on 2 cores);
# pip caches the wheel, so later installs take seconds.
"$VENV/bin/python" -m pip install --quiet -c constraints.txt "${args[@]}"
echo "$want" > "$stamp"
