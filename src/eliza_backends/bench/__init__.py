"""``eliza-backends bench``: measure each backend on a bundle, each run in a fresh process.

:mod:`.runner` drives the runs (load, time to first token, prefill and decode tokens/s,
drafter acceptance, peak RSS; interleaved workers, medians) and :mod:`.media` adds a media
bundle's image and audio prefill times beside the runtime's own media path. The worker entry
is ``python -m eliza_backends.bench``.
"""

from __future__ import annotations

from .runner import (
    PROGRESS_MARK,
    BenchReport,
    ProgressCallback,
    bench,
    cell,
    format_table,
    peak_rss_mb,
    run_worker,
    spawn_worker,
    summarize,
)

__all__ = ["PROGRESS_MARK", "BenchReport", "ProgressCallback", "bench", "cell", "format_table",
           "peak_rss_mb", "run_worker", "spawn_worker", "summarize"]
