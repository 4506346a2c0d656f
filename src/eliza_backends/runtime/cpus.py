"""The CPUs this process may run on: the default thread count of a runtime's compute threads
(``StreamConfig.threads`` unset) and the budget batch generation splits between sessions."""

from __future__ import annotations

import os


def cpu_count() -> int:
    """CPUs this process may run on (its affinity mask where the OS has one)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # macOS, Windows
        return os.cpu_count() or 1


__all__ = ["cpu_count"]
