#!/usr/bin/env bash
# Install, lint (ruff), type-check (mypy --strict on the core, every plugin and the docs example
# plugin) and run the whole test suite.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install.sh
.venv/bin/ruff check src plugins tests tools benchmarks examples docs
.venv/bin/mypy --strict src plugins/*/src docs/examples/eliza_echo/src
exec .venv/bin/python -m pytest "$@"
