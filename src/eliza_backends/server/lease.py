"""One request's hold on a pool slot (:class:`Lease`): work on the slot's thread, a generation's
steps run back to back there (or on the batched context's stepping thread), cancel, and the
slot given back exactly once. Split from :mod:`.pool`, which hands leases out."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable
from concurrent.futures import Future
from typing import TYPE_CHECKING, TypeVar

from ..config import StreamConfig
from ..errors import CancelledError, ElizaError, InvalidArgumentError
from ..serving import session_key
from ..stream import Stream

if TYPE_CHECKING:
    from .pool import SessionPool, Slot

T = TypeVar("T")


class Lease:
    """One request's hold on a slot. Use it from the event loop: :meth:`call` runs work on the
    slot's thread, :meth:`run_steps` runs a generation's steps there back to back,
    :meth:`cancel` stops it, :meth:`release` (idempotent) gives the slot back."""

    def __init__(self, pool: SessionPool, slot: Slot, config: StreamConfig) -> None:
        self.pool = pool
        self.slot = slot
        self.config = config
        self.cancel_reason: str | None = None
        #: work items that completed on the slot's thread; and how many had when cancelled
        self.steps = 0
        self.steps_at_cancel: int | None = None
        self._failed = False
        self._released = False
        self._freed: asyncio.Future[None] | None = None
        #: the running job of :meth:`run_steps` (on the slot's thread or an adopted one)
        self._job: Future[None] | None = None

    async def call(self, work: Callable[[Stream], T], config: StreamConfig | None = None) -> T:
        """Run ``work(stream)`` on the slot's thread and return its result. With ``config``,
        the slot's session is first made to fit it (reopened when its settings differ).
        A backend failure marks the session for reopening when the lease is released."""
        slot, pool = self.slot, self.pool

        def job() -> T:
            if self.cancel_reason is not None:
                raise CancelledError(f"cancelled: {self.cancel_reason}")
            if config is not None and session_key(config) != slot.key:
                pool._open_slot(slot, config)
                pool.reopened += 1
            assert slot.stream is not None
            try:
                result = work(slot.stream)
                self.steps += 1
                return result
            except (InvalidArgumentError, CancelledError):
                raise
            except BaseException:
                self._failed = True
                raise

        future: Future[T] = slot.executor.submit(job)
        try:
            return await asyncio.wrap_future(future)
        except asyncio.CancelledError:
            self.cancel("the request was cancelled")
            raise

    async def run_steps(self, work: Callable[[Stream], T], last: Callable[[T], bool]
                        ) -> AsyncIterator[T]:
        """Run ``work(stream)`` again and again on the slot's thread (or the context's
        stepping thread, :meth:`_adopted`) until ``last(result)``
        says it was the last, yielding each result. The slot's thread does not wait for the
        consumer between steps (a stream asks its batch for the next token at once, so a
        batched context gathers every sequence into each step, however busy the event loop
        is); the results queue up until read. A failure ends it (raised here); so does a
        cancel. Leaving early (or cancelling the awaiting task) cancels the lease."""
        loop = asyncio.get_running_loop()
        queue: asyncio.Queue[tuple[T | None, BaseException | None, bool]] = asyncio.Queue()
        slot = self.slot

        def post(item: tuple[T | None, BaseException | None, bool]) -> None:
            with contextlib.suppress(RuntimeError):  # no event loop: the server stopped
                loop.call_soon_threadsafe(queue.put_nowait, item)

        def job() -> None:
            while True:
                try:
                    if self.cancel_reason is not None:
                        raise CancelledError(f"cancelled: {self.cancel_reason}")
                    assert slot.stream is not None
                    result = work(slot.stream)
                    self.steps += 1
                    done = last(result)
                except BaseException as exc:
                    if not isinstance(exc, InvalidArgumentError | CancelledError):
                        self._failed = True
                    post((None, exc, True))
                    return
                post((result, None, done))
                if done:
                    return

        self._job = self._adopted(job) or slot.executor.submit(job)
        finished = False
        try:
            while not finished:
                result, error, finished = await queue.get()
                if error is not None:
                    raise error
                yield result  # type: ignore[misc]  # a result, when there is no error
        finally:
            if not finished:
                self.cancel("the response ended before its generation")

    def _adopted(self, job: Callable[[], None]) -> Future[None] | None:
        """``job`` running on the stepping thread of the batched context the slot's session
        decodes on, when that thread is free (None: run it on the slot's thread). There the
        stream's steps are decoded with no hop between threads: a token costs one thread's
        wake-up less (issue 39's one-client throughput)."""
        stream = self.slot.stream
        scheduler = None if stream is None else stream.session.scheduler
        return None if scheduler is None else scheduler.adopt(job)

    @property
    def released(self) -> bool:
        """True once :meth:`release` ran."""
        return self._released

    def cancel(self, reason: str = "the client went away") -> None:
        """Stop the running step and refuse further work (any time, from the event loop)."""
        if self.cancel_reason is None:
            self.cancel_reason = reason
            self.steps_at_cancel = self.steps
        stream = self.slot.stream
        if stream is not None and not self._released:
            stream.cancel()

    def release(self, text: str = "") -> asyncio.Future[None]:
        """Give the slot back: it is settled on its thread (rewound after a cancel, reopened
        after a failure), remembers ``text`` (what its session now holds) for routing, and
        then serves the next request. Never blocks; idempotent. The returned future is done
        once the slot is free (await it before answering, so that the client's next request
        finds the slot it just used)."""
        if self._freed is not None:
            return self._freed
        loop = asyncio.get_running_loop()
        self._freed = freed = loop.create_future()
        self._released = True
        pool, slot = self.pool, self.slot
        cancelled, failed = self.cancel_reason is not None, self._failed

        def settle() -> None:  # runs after the lease's last job finished
            if self.steps_at_cancel is not None:
                pool.steps_after_cancel.append(self.steps - self.steps_at_cancel)
            stream = slot.stream
            try:
                if failed or stream is None or stream.session.closed:
                    assert slot.config is not None
                    pool._open_slot(slot, slot.config)
                else:
                    stream.end_generation()  # the lease's completion is over, however it ended
                    if stream.session.cancelled:
                        stream.reset_keep(stream.session.n_past)
                    slot.text = text if stream.session.n_past else ""
            except ElizaError:
                slot.text = ""

        pool.served += 1
        pool.cancelled += cancelled
        pool.failed += failed
        slot.served += 1

        def free() -> None:
            pool._free(slot)
            if not freed.done():
                freed.set_result(None)

        def settled(_future: Future[None]) -> None:
            with contextlib.suppress(RuntimeError):  # no event loop: the server stopped
                loop.call_soon_threadsafe(free)

        def after_the_job(_job: Future[None] | None = None) -> None:
            slot.executor.submit(settle).add_done_callback(settled)

        if self._job is None:
            after_the_job()
        else:  # (an adopted job may still be running on the stepping thread)
            self._job.add_done_callback(after_the_job)
        return freed


__all__ = ["Lease"]
