#!/usr/bin/env bash
# Install, lint (ruff), type-check (mypy --strict on the core, every plugin and the docs example
# plugin) and run the tests. Arguments after the options go to pytest.
#
#   bash scripts/test.sh            the full tier: every test (what CI runs; add
#                                   ELIZA_REAL_MODELS=1 for the real-model tier)
#   bash scripts/test.sh --quick    the quick tier (pytest -m quick: contract, selector, stream,
#                                   chat, structured and server tests on the tiny bundle; under
#                                   5 minutes on 2 cores), after the same ruff and mypy
#   bash scripts/test.sh --only ruff|mypy|pytest   one step (.ci/run times them apart)
#
# The tiers are markers (tests/conftest.py puts every test module in one; pyproject.toml lists
# them): quick, and in the full tier only slow, fuzz, crash_oracle, ray and real.
set -euo pipefail
cd "$(dirname "$0")/.."
only=""
marks=()
while [ $# -gt 0 ]; do
  case "$1" in
    --quick) marks=(-m quick); shift ;;
    --only) only=$2; shift 2 ;;
    *) break ;;
  esac
done
bash scripts/install.sh
if [ -z "$only" ] || [ "$only" = ruff ]; then
  .venv/bin/ruff check src plugins tests tools benchmarks examples docs
fi
if [ -z "$only" ] || [ "$only" = mypy ]; then
  .venv/bin/mypy --strict src plugins/*/src docs/examples/eliza_echo/src
fi
if [ -z "$only" ] || [ "$only" = pytest ]; then
  exec .venv/bin/python -m pytest "${marks[@]}" "$@"
fi
