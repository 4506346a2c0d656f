#!/usr/bin/env bash
# Stream text from the bundled tiny model through every backend installed here.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install.sh
exec .venv/bin/python examples/demo.py "$@"
