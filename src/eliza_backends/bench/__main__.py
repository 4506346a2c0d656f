"""The bench's worker process: ``python -m eliza_backends.bench ARGS`` (one run, JSON on stdout)."""

from __future__ import annotations

import sys

from .runner import worker_main

raise SystemExit(worker_main(sys.argv[1:]))
