"""A pool of sessions over one model load, leased to concurrent requests.

:class:`SessionPool` opens ``sessions`` streams on one :class:`InferenceContext` (the weights are
loaded once) and gives each its own worker thread: a session has one consumer, so everything a
session does runs on its slot's thread (a generation's steps: on the stepping thread of a
batched llama.cpp context when free, :meth:`Lease.start_steps`); the event loop awaits results.

* **Leases.** :meth:`SessionPool.acquire` returns a :class:`Lease` on a free slot. When every
  slot is busy, up to ``max_queue`` requests wait in FIFO order; one more raises
  :class:`PoolFullError` (the server answers 429). After :meth:`SessionPool.begin_shutdown`
  new requests get :class:`PoolClosedError` (503).
* **Prefix routing.** Each slot remembers, as text, what its session holds (its last prompt and
  reply). A request goes to the free slot (settings fitting) whose text shares the longest
  prefix with its rendered prompt, at least :data:`SIMILARITY` of that text or of the prompt
  (a continuing conversation, or a prompt asked again, finds its KV cache, as llama-server's
  ``--slot-prompt-similarity`` routes); else to the least recently used slot. The text is only
  a hint: :meth:`Stream.prefill_reusing` computes the exact token prefix to keep.
* **Prompt cache.** ``cache_bytes > 0``: the slots share one
  :class:`~eliza_backends.backend.prompt_cache.PromptCache` of that many bytes; a slot about to
  serve another conversation saves the one it holds there first, and a conversation that comes
  back restores its state from it (on whichever slot serves it) and prefills only its new tokens
  (counters: :attr:`PoolStats.prompt_cache`, ``/health``).
* **Settings.** Sampling settings are baked into a session when it opens, so a request with
  other settings than its slot's reopens that slot's session (on the same context: no reload).
  Budget and stop strings are per request (:class:`~eliza_backends.openai.generation.Generation`).
* **Cancel.** :meth:`Lease.cancel` stops the running step (``Session.cancel`` from the event
  loop); releasing a lease settles the slot on its thread first (a cancelled session is
  rewound with ``reset_keep``, keeping its valid prefix; a session that failed in the runtime is
  reopened), then frees it for the next request.
* **Batching.** ``parallel=N`` opens the slots on one ``InferenceContext(parallel=N)``: on a
  ``batched`` backend (llama.cpp) the N sessions share one runtime context, decoded together
  one batch per step (continuous batching); a backend that does not batch (LiteRT, MLX) runs
  N independent sessions and says so (a warning at :meth:`SessionPool.open`,
  :attr:`SessionPool.batching` on ``/health``). ``parallel="auto"``:
  :data:`~eliza_backends.batch.DEFAULT_PARALLEL` slots on a batching backend, else one.
  ``sessions=N`` (``parallel=None``): N independent sessions; asking for both is an error.

Threads: the pool's methods are called from one event loop; slot work runs on the slots'
threads. CPU threads (:func:`~eliza_backends.batch.session_threads`): unless the config says
otherwise, independent sessions get ``cores // sessions`` compute threads each (concurrent
sessions do not oversubscribe); slots sharing one batched runtime context share all the cores.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import time
from collections import deque
from collections.abc import AsyncIterator, Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Literal, TypeVar

from ..backend.context import InferenceContext
from ..backend.prompt_cache import SIMILARITY, PromptCache
from ..batch import DEFAULT_PARALLEL, batches, session_threads
from ..config import StreamConfig
from ..errors import (
    CancelledError,
    ElizaError,
    InvalidArgumentError,
    PoolClosedError,
    PoolFullError,
    SessionBusyError,
)
from ..serving import SessionKey, serving_config, session_key
from ..stream import Stream, open_stream
from .pool_stats import PoolStats
from .step_feed import StepFeed
from .throughput import Throughput
from .warmup import warm_up

T = TypeVar("T")
S = TypeVar("S")

log = logging.getLogger("eliza_backends.server")

def shared_prefix(a: str, b: str) -> int:
    """Length of the longest common prefix of two strings (binary search on slices, so the
    comparisons run in C)."""
    lo, hi = 0, min(len(a), len(b))
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if a[:mid] == b[:mid]:
            lo = mid
        else:
            hi = mid - 1
    return lo


@dataclass(eq=False)
class Slot:
    """One pooled session and the thread it runs on."""

    index: int
    executor: ThreadPoolExecutor
    stream: Stream | None = None
    key: SessionKey = ()
    config: StreamConfig | None = None
    text: str = ""  # what the session holds, as text (a routing hint)
    busy: bool = False
    last_used: float = 0.0
    served: int = 0
    lease: Lease | None = None


@dataclass(eq=False)
class _Waiter:
    future: asyncio.Future[Slot]
    text: str
    key: SessionKey


class SessionPool:
    """Sessions on one bundle's :class:`InferenceContext`, leased to requests; see the module
    doc.

    ``config``: the base :class:`StreamConfig` (context size, threads, backend options,
    default sampling); ``sessions`` independent sessions, or ``parallel`` batched ones (int or
    ``"auto"``); ``max_queue`` requests may wait (default: 4 per session); ``backend``: a hard
    backend request; ``cores``: the CPU budget (default: this process's CPUs); ``warm``:
    :meth:`open` warms each runtime context up (:func:`~eliza_backends.server.warmup.warm_up`);
    ``cache_bytes``: the prompt cache's bound (0: none). :meth:`open` loads the model and opens
    every session (call it before serving); :meth:`close` frees them."""

    def __init__(self, bundle: str | os.PathLike[str] | InferenceContext,
                 config: StreamConfig | None = None, *, sessions: int = 1,
                 parallel: int | Literal["auto"] | None = None, max_queue: int | None = None,
                 backend: str | None = None, cores: int | None = None,
                 warm: bool = False, cache_bytes: int = 0) -> None:
        if sessions < 1:
            raise InvalidArgumentError(f"sessions must be >= 1, got {sessions}")
        if parallel is not None and parallel != "auto" and (
                isinstance(parallel, bool) or not isinstance(parallel, int) or parallel < 1):
            raise InvalidArgumentError(f"parallel must be an integer >= 1 or 'auto', got "
                                       f"{parallel!r}")
        if parallel is not None and sessions > 1:
            raise InvalidArgumentError(
                f"sessions={sessions} and parallel={parallel}: give one of them (parallel=N: N "
                "sequences batched in one runtime context sharing every core; sessions=N: N "
                "independent sessions splitting the cores)")
        self._base = config or StreamConfig()
        self._sessions = sessions
        self._parallel = parallel
        self._cores = cores
        self._max_queue = max_queue
        self._warm = warm
        #: seconds the warm-up took at :meth:`open` (0: none)
        self.warmup_seconds = 0.0
        if max_queue is not None and max_queue < 0:
            raise InvalidArgumentError(f"max_queue must be >= 0, got {max_queue}")
        if cache_bytes < 0:
            raise InvalidArgumentError(f"cache_bytes must be >= 0, got {cache_bytes}")
        #: the slots' shared prompt cache (None: off)
        self.prompt_cache = PromptCache(cache_bytes) if cache_bytes else None
        self.max_queue = max_queue if max_queue is not None else 4 * sessions
        self.config = serving_config(self._base)
        self._owns_context = not isinstance(bundle, InferenceContext)
        wanted = DEFAULT_PARALLEL if parallel == "auto" else parallel or 1
        self.context = bundle if isinstance(bundle, InferenceContext) else \
            InferenceContext(bundle, parallel=wanted)
        self._backend_request = backend
        self.backend = ""
        self.slots: list[Slot] = []
        #: True when the slots share one batched runtime context (known after :meth:`open`)
        self.batched = False
        #: how the sessions run, in words (see :class:`PoolStats`)
        self.batching = ""
        self.throughput = Throughput()
        self._waiters: deque[_Waiter] = deque()
        self._draining = False
        self._closed = False
        self.served = self.cancelled = self.reopened = self.failed = 0
        #: tokens the sessions' drafters proposed, and how many the model kept (all requests)
        self.drafted = self.accepted = 0
        #: per cancelled lease: steps that still completed after cancel() (0 or 1 expected)
        self.steps_after_cancel: deque[int] = deque(maxlen=64)
        self.chat_template: str | None = None
        self.template_tokens: dict[str, str] = {}
        self.context_size = 0

    # ------------------------------------------------------------------ lifecycle

    def _add_slot(self, config: StreamConfig) -> Slot:
        slot = Slot(len(self.slots), ThreadPoolExecutor(
            1, thread_name_prefix=f"eliza-session-{len(self.slots)}"))
        self.slots.append(slot)
        slot.executor.submit(self._open_slot, slot, config).result()
        return slot

    def open(self) -> None:
        """Load the model and open every session (each on its own thread): the first one
        tells whether the backend batches, which decides how many sessions (``"auto"``) and
        their threads. Raises the backend's :class:`ElizaError` when it cannot."""
        try:
            batching = self._parallel is not None
            count = self._sessions if not batching else \
                DEFAULT_PARALLEL if self._parallel == "auto" else int(self._parallel or 1)
            config = serving_config(session_threads(self._base, count, shared=batching,
                                                    cores=self._cores))
            first = self._add_slot(config)
            assert first.stream is not None
            self.backend = first.stream.backend
            self.batched = batches(first.stream)
            if batching and not self.batched:
                count = 1 if self._parallel == "auto" else count
                config = serving_config(session_threads(self._base, count, shared=False,
                                                        cores=self._cores))
                if config != first.config:  # its share of the cores, not all of them
                    first.executor.submit(self._open_slot, first, config).result()
            self.config = config
            while len(self.slots) < count:
                self._add_slot(config)
            if self._warm:
                self.warmup_seconds = self._warm_up()
        except BaseException:
            self.close()
            raise
        if self._max_queue is None:
            self.max_queue = 4 * len(self.slots)
        self.batching = self._describe()
        if self._parallel not in (None, "auto") and not self.batched and count > 1:
            log.warning("%s", self.batching)
        stream = first.stream
        self.chat_template = stream.config.chat_template or stream.session.chat_template
        self.template_tokens = stream.session.template_tokens
        self.context_size = stream.session.context_size

    def _warm_up(self) -> float:
        """Warm every runtime context up on its slots' threads (a batched one once, through
        its first slot); returns the longest warm-up's seconds."""
        slots = self.slots[:1] if self.batched else self.slots
        jobs = [s.executor.submit(warm_up, s.stream) for s in slots if s.stream is not None]
        return max((job.result() for job in jobs), default=0.0)

    def _describe(self) -> str:
        n, threads = len(self.slots), self.config.threads
        if self.batched:
            return (f"continuous batching: {n} sequences share one {self.backend} context "
                    f"({threads} threads)")
        if n == 1:
            return f"1 session ({threads} threads)" + (
                f"; {self.backend} does not batch, --parallel N runs N independent sessions"
                if self._parallel == "auto" else "")
        if self._parallel is None:
            return f"{n} independent sessions ({threads} threads each)"
        return (f"{self.backend} does not batch: parallel {n} runs {n} independent sessions, "
                f"the cores split {n} ways ({threads} threads each)")

    def _open_slot(self, slot: Slot, config: StreamConfig) -> None:
        if slot.stream is not None:
            self._keep_state(slot.stream)
            slot.stream.close()
            slot.stream = None
        slot.stream = stream = open_stream(self.context, config, backend=self._backend_request)
        if stream.session.capabilities.slots:
            stream.prompt_cache = self.prompt_cache
        slot.config, slot.key, slot.text = config, session_key(config), ""

    def _keep_state(self, stream: Stream) -> None:
        """Save the conversation a session holds into the prompt cache before the session is
        closed (reopened with other settings); nothing when there is no cache or no state."""
        cache, session = stream.prompt_cache, stream.session
        if cache is None or session.closed or not session.n_past or session.cancelled:
            return
        try:
            cache.store(session.save_slot())
        except ElizaError as exc:
            log.debug("slot %s: state not kept in the prompt cache: %s", stream.backend, exc)

    def begin_shutdown(self, grace: float) -> None:
        """Take no new requests (waiting ones get :class:`PoolClosedError`); after ``grace``
        seconds, cancel the generations still running. Call from the event loop."""
        if self._draining:
            return
        self._draining = True
        while self._waiters:
            waiter = self._waiters.popleft()
            if not waiter.future.done():
                waiter.future.set_exception(PoolClosedError("the server is shutting down"))
        asyncio.get_running_loop().call_later(grace, self._cancel_all)

    def _cancel_all(self) -> None:
        for slot in self.slots:
            if slot.lease is not None:
                slot.lease.cancel("the server is shutting down")

    @property
    def draining(self) -> bool:
        """True after :meth:`begin_shutdown`."""
        return self._draining

    def close(self) -> None:
        """Close every session and the context (if the pool made it); idempotent. Running
        steps are cancelled first."""
        if self._closed:
            return
        self._closed = True
        for slot in self.slots:
            if slot.stream is not None:
                slot.stream.cancel()
        for slot in self.slots:
            stream, slot.stream = slot.stream, None
            if stream is not None:
                slot.executor.submit(stream.close).result()
            slot.executor.shutdown(wait=True)
        if self._owns_context:
            self.context.close()

    # ------------------------------------------------------------------ leasing

    async def acquire(self, text: str, config: StreamConfig) -> Lease:
        """A lease on the best free slot for a request whose prompt renders to ``text`` and
        whose session needs ``config``; waits in the queue when all are busy. Raises
        :class:`PoolFullError` when the queue is full, :class:`PoolClosedError` when
        shutting down."""
        if self._draining or self._closed:
            raise PoolClosedError("the server is shutting down; retry on another server")
        key = session_key(config)
        slot = self._pick(text, key)
        if slot is None:
            if len(self._waiters) >= self.max_queue:
                raise PoolFullError(
                    f"all {len(self.slots)} sessions are busy and {len(self._waiters)} requests "
                    "are waiting; retry later, or start the server with a larger --parallel (or "
                    "--sessions) or a longer --queue")
            waiter = _Waiter(asyncio.get_running_loop().create_future(), text, key)
            self._waiters.append(waiter)
            try:
                slot = await waiter.future
            except asyncio.CancelledError:
                if waiter in self._waiters:
                    self._waiters.remove(waiter)
                elif waiter.future.done() and not waiter.future.cancelled() and \
                        waiter.future.exception() is None:
                    self._free(waiter.future.result())  # handed a slot, then cancelled
                raise
        slot.busy = True
        slot.last_used = time.monotonic()
        lease = Lease(self, slot, config)
        slot.lease = lease
        return lease

    def lease_slot(self, index: int) -> Lease:
        """A lease on slot ``index`` now (the ``/slots`` actions): :class:`InvalidArgumentError`
        when there is no such slot, :class:`SessionBusyError` while it serves a request,
        :class:`PoolClosedError` when shutting down. Call from the event loop."""
        if self._draining or self._closed:
            raise PoolClosedError("the server is shutting down")
        if not 0 <= index < len(self.slots):
            raise InvalidArgumentError(f"no slot {index}: this server has slots 0 to "
                                       f"{len(self.slots) - 1}")
        slot = self.slots[index]
        if slot.busy or slot.stream is None or slot.config is None:
            raise SessionBusyError(f"slot {index} is serving a request; retry when it is idle")
        slot.busy, slot.last_used = True, time.monotonic()
        slot.lease = lease = Lease(self, slot, slot.config)
        return lease

    def _pick(self, text: str, key: SessionKey) -> Slot | None:
        best: Slot | None = None
        best_score: tuple[int, float, int] | None = None
        for slot in self.slots:
            if slot.busy or slot.stream is None:
                continue
            fits = slot.key == key
            shared = shared_prefix(slot.text, text) if fits else 0
            if shared < SIMILARITY * min(len(slot.text), len(text)):
                shared = 0  # a different conversation: keep its cache, use an LRU slot
            score = (shared, -slot.last_used, int(fits))
            if best_score is None or score > best_score:
                best, best_score = slot, score
        return best

    def _free(self, slot: Slot) -> None:
        slot.busy = False
        slot.lease = None
        slot.last_used = time.monotonic()
        while self._waiters:
            waiter = self._waiters.popleft()
            if not waiter.future.done():
                slot.busy = True
                waiter.future.set_result(slot)
                return

    def count_tokens(self, completion: int, drafted: int = 0, accepted: int = 0) -> None:
        """Count tokens a request generated (and its drafter proposed / the model kept);
        call from the event loop."""
        self.throughput.add(completion)
        self.drafted += drafted
        self.accepted += accepted

    def _draft_totals(self) -> dict[str, Any] | None:
        if self.config.drafter == "none":
            return None
        return {"drafter": self.config.drafter, "drafted": self.drafted,
                "accepted": self.accepted,
                "acceptance": round(self.accepted / self.drafted, 4) if self.drafted else None}

    def stats(self) -> PoolStats:
        """Current counters."""
        busy = sum(s.busy for s in self.slots)
        batch = self.context.batch_stats()
        return PoolStats(
            sessions=len(self.slots), busy=busy,
            queued=len(self._waiters), served=self.served, cancelled=self.cancelled,
            reopened=self.reopened, failed=self.failed, draining=self._draining,
            parallel=1 if self._parallel is None or (self._parallel == "auto" and
                                                     not self.batched) else len(self.slots),
            batched=self.batched, batching=self.batching, active_sequences=busy,
            tokens_per_second=round(self.throughput.rate(), 2),
            tokens_window_s=self.throughput.window,
            completion_tokens=self.throughput.total,
            batch=None if batch is None else batch.summary(), draft=self._draft_totals(),
            prompt_cache=None if self.prompt_cache is None else self.prompt_cache.stats(),
            steps_after_cancel=list(self.steps_after_cancel),
            slots=[{"index": s.index, "busy": s.busy, "served": s.served,
                    "n_past": s.stream.session.n_past if s.stream is not None else 0,
                    "text_chars": len(s.text)}
                   for s in self.slots])


class Lease:
    """One request's hold on a slot. Use it from the event loop: :meth:`call` runs work on the
    slot's thread, :meth:`start_steps` starts a generation and runs its steps back to back,
    :meth:`cancel` stops it, :meth:`release` (idempotent) gives the slot back."""

    def __init__(self, pool: SessionPool, slot: Slot, config: StreamConfig) -> None:
        self.pool, self.slot, self.config = pool, slot, config
        self.cancel_reason: str | None = None
        #: work items that completed on the slot's thread; and how many had when cancelled
        self.steps = 0
        self.steps_at_cancel: int | None = None
        self._failed = self._released = False
        self._freed: asyncio.Future[None] | None = None
        #: the running job of :meth:`start_steps` (on the slot's thread or an adopted one)
        self._job: Future[None] | None = None

    async def call(self, work: Callable[[Stream], T], config: StreamConfig | None = None) -> T:
        """Run ``work(stream)`` on the slot's thread and return its result. With ``config``,
        the slot's session is first made to fit it (reopened when its settings differ).
        A backend failure marks the session for reopening when the lease is released."""
        future: Future[T] = self.slot.executor.submit(self._work, work, config)
        try:
            return await asyncio.wrap_future(future)
        except asyncio.CancelledError:
            self.cancel("the request was cancelled")
            raise

    def _work(self, work: Callable[[Stream], T], config: StreamConfig | None) -> T:
        """``work(stream)`` on the slot's session (made to fit ``config`` first), counted."""
        slot = self.slot
        if self.cancel_reason is not None:
            raise CancelledError(f"cancelled: {self.cancel_reason}")
        if config is not None and session_key(config) != slot.key:
            self.pool._open_slot(slot, config)
            self.pool.reopened += 1
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

    async def start_steps(self, start: Callable[[Stream], S], config: StreamConfig,
                          steps: Callable[[S], Callable[[Stream], T]],
                          last: Callable[[T], bool]) -> tuple[S, AsyncIterator[T]]:
        """Run ``start(stream)`` as :meth:`call` does, then in the same job ``steps(started)``
        again and again until ``last(result)``: a prompt's prefill and its first tokens with no
        hop between threads or through the event loop (on the stepping thread of a batched
        context when free, else the slot's thread). Returns ``start``'s result (what it raised
        is raised here; no step runs then) and an iterator of the steps' results, which queue
        up (the steps do not wait for the consumer, but on the stepping thread for the first
        result to be sent: :class:`~eliza_backends.server.step_feed.StepFeed`). A failure or a
        cancel ends the steps (raised by the iterator); leaving it early or cancelling the
        awaiting task cancels the lease."""
        started: Future[S] = Future()
        feed: StepFeed[T] = StepFeed(lambda: self.cancel("the response ended before its "
                                                         "generation"))

        def job(on_stepping_thread: bool) -> None:
            if not started.set_running_or_notify_cancel():
                return  # (the awaiting task was cancelled)
            try:
                result = self._work(start, config)
            except BaseException as exc:
                started.set_exception(exc)
                return
            started.set_result(result)
            work = steps(result)
            while True:
                try:
                    out = self._work(work, None)
                    done = last(out)
                except BaseException as exc:
                    feed.post(None, exc, True)
                    return
                feed.post(out, None, done)
                if done:
                    return
                if on_stepping_thread:
                    feed.see_off()

        stream = self.slot.stream
        stepper = None if stream is None else stream.session.scheduler
        adopted = None if stepper is None else stepper.adopt(lambda: job(True))
        self._job = adopted or self.slot.executor.submit(job, False)
        try:
            return await asyncio.wrap_future(started), feed.results()
        except asyncio.CancelledError:
            self.cancel("the request was cancelled")
            raise

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
        """Give the slot back: settled on its thread after the lease's job (rewound after a
        cancel, reopened after a failure), remembering ``text`` (what its session holds) for
        routing. Never blocks; idempotent. The future is done once the slot is free (await it
        before answering: the client's next request then finds this slot)."""
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

        def after_the_job(_job: object = None) -> None:
            slot.executor.submit(settle).add_done_callback(settled)

        # (an adopted job may still be running on the stepping thread: settle after it)
        after_the_job() if self._job is None else self._job.add_done_callback(after_the_job)
        return freed


__all__ = ["Lease", "PoolClosedError", "PoolFullError", "PoolStats", "SessionPool", "Slot",
           "shared_prefix"]
