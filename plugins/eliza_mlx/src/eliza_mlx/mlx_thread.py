"""The one thread that runs every mlx call of the process.

mlx keeps streams per thread. A thread that used mlx and ends without clearing them leaves
them to mlx's exit-time teardown, which then destroys a stream's worker ``std::thread`` while
it is still joinable: "terminate called without an active exception" and SIGABRT at exit, in
about 7 runs of 10 (upstream: plain mlx-lm from a worker thread does it too). Applications
drive sessions from worker threads all the time (``async for`` runs each step in one), so this
plugin never calls mlx from them: :data:`MLX_THREAD` is a daemon thread that runs every mlx
call (loading the weights, each session hook, the draft model), and at interpreter exit it
synchronises, clears its streams and ends (:func:`atexit`), before mlx tears down.

Calls made on that thread run inline (a hook calling the draft model). The caller waits for
its call; a ``KeyboardInterrupt`` that reaches the waiting caller is re-raised only once the
call has finished, so the session never sees two calls at once. After the exit hook ran, calls
run inline on the caller's thread (finalizers at exit still free sessions).
"""

from __future__ import annotations

import atexit
import functools
import queue
import threading
from collections.abc import Callable
from typing import Any, TypeVar, cast

T = TypeVar("T")
F = TypeVar("F", bound=Callable[..., Any])


class _Job:
    __slots__ = ("done", "error", "fn", "result")

    def __init__(self, fn: Callable[[], Any]) -> None:
        self.fn = fn
        self.done = threading.Event()
        self.result: Any = None
        self.error: BaseException | None = None


class MLXThread:
    """A daemon thread running submitted calls one at a time, in order (started lazily)."""

    def __init__(self, name: str = "eliza-mlx") -> None:
        self._name = name
        self._queue: queue.SimpleQueue[_Job | None] = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self._ident: int | None = None
        self._stopped = False

    def run(self, fn: Callable[[], T]) -> T:
        """Run ``fn()`` on the MLX thread and return its result (or raise its exception)."""
        if threading.get_ident() == self._ident:
            return fn()
        job = _Job(fn)
        if not self._submit(job):
            return fn()
        try:
            job.done.wait()
        except BaseException:
            # (a KeyboardInterrupt in the waiting thread): the call still runs on the MLX
            # thread; let it finish before the caller moves on
            while not job.done.is_set():
                try:
                    job.done.wait()
                except BaseException:  # more Ctrl-C while waiting: keep waiting
                    continue
            raise
        if job.error is not None:
            raise job.error
        return cast(T, job.result)

    def _submit(self, job: _Job) -> bool:
        """Queue ``job``, starting the thread the first time; False after :meth:`stop` (the
        caller then runs it inline)."""
        with self._lock:
            if self._stopped:
                return False
            if self._thread is None:
                ready = threading.Event()
                thread = threading.Thread(target=self._loop, args=(ready,), name=self._name,
                                          daemon=True)
                thread.start()
                ready.wait()
                self._thread = thread
                atexit.register(self.stop)
            self._queue.put(job)
        return True

    def _loop(self, ready: threading.Event) -> None:
        self._ident = threading.get_ident()
        ready.set()
        while True:
            job = self._queue.get()
            if job is None:
                break
            try:
                job.result = job.fn()
            except BaseException as exc:
                job.error = exc
            finally:
                job.done.set()
            del job
        try:  # leave no stream of this thread to mlx's exit-time teardown
            import mlx.core as mx  # type: ignore[import-not-found,unused-ignore]

            mx.synchronize()
            mx.clear_streams()
        except Exception:  # (mlx never loaded, or already torn down)
            pass

    def stop(self, timeout: float = 10.0) -> None:
        """End the thread after the calls already queued (the exit hook); later calls run
        inline on their caller's thread."""
        with self._lock:
            if self._stopped:
                return
            self._stopped = True
            thread = self._thread
        if thread is not None:
            self._queue.put(None)
            thread.join(timeout)
        self._ident = None


#: The process's MLX thread.
MLX_THREAD = MLXThread()


def on_mlx_thread(method: F) -> F:
    """Decorator: the function (a session hook, a loader) runs on :data:`MLX_THREAD`."""

    @functools.wraps(method)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        return MLX_THREAD.run(lambda: method(*args, **kwargs))

    return cast(F, wrapper)


__all__ = ["MLX_THREAD", "MLXThread", "on_mlx_thread"]
