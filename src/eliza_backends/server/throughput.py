"""Generated tokens per second over a recent window, for ``/health``.

:class:`Throughput` counts the completion tokens every request's steps produce (all slots
together) and answers the aggregate rate over the last ``window`` seconds (over the time since
it started, while that is shorter). Thread-safe: the event loop adds, any thread may read.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable

#: Seconds of history the rate is computed over.
WINDOW = 10.0


class Throughput:
    """Tokens counted with :meth:`add`; :meth:`rate` is tokens per second over the last
    ``window`` seconds; :attr:`total` every token since it started. ``clock`` returns
    seconds (default :func:`time.monotonic`)."""

    def __init__(self, window: float = WINDOW, clock: Callable[[], float] = time.monotonic
                 ) -> None:
        self.window = window
        self._clock = clock
        self._started = clock()
        self._events: deque[tuple[float, int]] = deque()
        self._in_window = 0
        self._lock = threading.Lock()
        #: tokens counted since the start
        self.total = 0

    def add(self, tokens: int) -> None:
        """Count ``tokens`` generated now."""
        if tokens <= 0:
            return
        with self._lock:
            now = self._clock()
            self._events.append((now, tokens))
            self._in_window += tokens
            self.total += tokens
            self._expire(now)

    def _expire(self, now: float) -> None:
        while self._events and self._events[0][0] < now - self.window:
            self._in_window -= self._events.popleft()[1]

    def rate(self) -> float:
        """Tokens per second over the last ``window`` seconds (0.0 before any)."""
        with self._lock:
            now = self._clock()
            self._expire(now)
            span = min(self.window, now - self._started)
            return self._in_window / span if span > 0 else 0.0


__all__ = ["WINDOW", "Throughput"]
