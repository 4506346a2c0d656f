"""A generation's step results, handed from the thread that runs its steps to the event loop.

:meth:`~eliza_backends.server.pool.Lease.start_steps` runs a prompt's prefill and its steps as
one job on another thread (the stepping thread of a batched llama.cpp context, or the slot's
thread); the job posts each result (:meth:`StepFeed.post`) and the request's task reads them
from :meth:`StepFeed.results`; posting never blocks, results queue up.

**The first result is seen off** (:meth:`StepFeed.see_off`): a job on the stepping thread
waits, at most :data:`SEE_OFF_S`, until the event loop has taken its first result and sent it
on, before it starts the next decode. That decode keeps both cores of a small machine busy
(the calling thread and llama.cpp's worker), and the event loop's thread, woken to send the
first token, waited for a core until the scheduler preempted one: measured with
``benchmarks/server_timeline.py`` (SmolLM2 Q4_1, 2 threads, one client), 1.6 ms from the post
of the first token to the event loop running it, 0.1 ms when the job waits (time to first
token 1.5 ms shorter). Later results are not waited for: their decodes are what a client
waits for anyway, and the event loop sends each one during the next.

Threads: :meth:`post` and :meth:`see_off` from the job's thread; :meth:`results` from the
event loop that made the feed.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import AsyncIterator, Callable
from typing import Generic, TypeVar

T = TypeVar("T")

#: The longest a job waits for the event loop to send its first result on (seconds): a busy
#: event loop costs the job's next step at most this, once per generation.
SEE_OFF_S = 0.003


class StepFeed(Generic[T]):
    """One generation's results (see the module doc). ``on_abandoned`` is called (on the event
    loop) when the reader leaves :meth:`results` before the last result."""

    def __init__(self, on_abandoned: Callable[[], None]) -> None:
        self._loop = asyncio.get_running_loop()
        self._queue: asyncio.Queue[tuple[T | None, BaseException | None, bool]] = \
            asyncio.Queue()
        self._sent = threading.Event()
        self._seen_off = False
        self._on_abandoned = on_abandoned

    def post(self, result: T | None, error: BaseException | None, last: bool) -> None:
        """Queue a step's ``result`` (or the ``error`` that ended the steps); ``last``: no
        more follow. Never blocks; a stopped event loop drops it."""
        with contextlib.suppress(RuntimeError):  # no event loop: the server stopped
            self._loop.call_soon_threadsafe(self._queue.put_nowait, (result, error, last))

    def see_off(self) -> None:
        """The first call waits until the reader has taken the first result and sent it on
        (at most :data:`SEE_OFF_S`); later calls return at once."""
        if not self._seen_off:
            self._seen_off = True
            self._sent.wait(SEE_OFF_S)

    async def results(self) -> AsyncIterator[T]:
        """The results in order; raises the error that ended the steps."""
        finished = False
        try:
            while not finished:
                result, error, finished = await self._queue.get()
                if error is not None:
                    raise error
                yield result  # type: ignore[misc]  # a result, when there is no error
                self._sent.set()
        finally:
            self._sent.set()
            if not finished:
                self._on_abandoned()


__all__ = ["SEE_OFF_S", "StepFeed"]
