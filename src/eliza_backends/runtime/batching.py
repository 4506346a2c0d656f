"""Continuous batching: a backend-neutral step scheduler for sequences sharing one runtime context.

Several sessions decode in one runtime context (llama.cpp: one ``llama_context`` with a
sequence id per session; MLX: one batched cache). Each session runs on its own thread and its
``prefill`` / ``next`` calls are synchronous, so the scheduler's unit is a **share**: what one
sequence wants decoded next (the tokens to feed at positions ``start..``, how many of the last
ones want outputs, and a callback that reads those outputs). The submitting thread blocks in
:meth:`StepScheduler.submit`; one thread at a time runs **steps**: it gathers the queued shares
into one batch, calls the backend's ``decode`` once for all of them, then runs the callback of
every share whose last piece was in the batch (before the next decode overwrites the outputs)
and wakes the submitters.

**Who runs the steps: a leader, not an engine thread.** The first submitter that finds no step
runner becomes the leader and runs steps until its own share is done, then hands the role to a
waiting submitter (if shares are still queued). A lone stream therefore decodes on its own
thread with no thread hop and no gather wait (the ``parallel=1`` cost), nothing has to be
started or joined when a context closes, and a failure in ``decode`` surfaces on a caller's
thread. The callbacks run on the leader's thread while every submitter of the batch is blocked,
so a share's state (its sampler, its logits hook) is only ever touched by one thread at a time.

**Or a thread of its own** (``stepping_thread``): a runtime whose native calls should all come
from one thread (llama.cpp's CPU backend keeps an OpenMP team per calling thread) gets a
stepping thread, started with the scheduler, and only that thread runs steps: a submitter
queues its share and waits, and the stepping thread gathers, decodes, runs the callbacks and
wakes it. :meth:`StepScheduler.adopt` hands that thread a whole job, a stream's loop of
``next`` calls (the server's streamed answers): its shares are then decoded with no hop
between threads at all, the job leading each step itself (every queued share included) when
it submits. Measured (``serve --parallel 8``, SmolLM2 Q4_1, 2 threads, one client): the time
between two ``llama_decode`` calls of a stream went from 0.98 to 0.39 ms (issue 39).

**Gathering (the fragmentation trap).** After a step every finished sequence's thread wakes,
does its per-token Python work (detokenize, stop strings, hand the token to a client) and
resubmits. A scheduler that decoded whatever was queued the moment it had one share would
alternate batches of 1 and N-1. So the leader waits until every sequence whose share finished
in the previous step (the *expected* ones) has resubmitted, or until :data:`GATHER_WINDOW_S`
has passed since it started gathering, whichever is first. A sequence that does not resubmit
within the window (a slow client, a stream that ended on a stop string) is not expected again
until it is decoded again, so it costs one window once. :meth:`StepScheduler.idle` says a
sequence will not resubmit soon (its stream ended, it was reset or closed): nobody waits for it.
:meth:`StepScheduler.expect` says the opposite of a sequence that is not running yet: a prompt on
its way (its thread first makes a call between steps, such as copying a shared prefix), waited
for like a running sequence, so prompts that arrive together share a step instead of the first
one starting a step of its own (measured, ``serve --parallel 8``, 8 clients arriving in a
burst: the first prefill used to decode alone while the others were 1 ms behind it).

**Calls between steps go first.** A thread blocked entering :meth:`StepScheduler.exclusive`
while a step decodes gets the runtime context before the leader's next step (the leader waits
for it, at most the gather window): the leader, already running, could otherwise take it again
first, and a request's slot save or prefix copy would wait several steps.

**Budget and order.** A step carries at most ``max_tokens`` tokens (the runtime's batch size).
Decode shares (every token wants an output: the one pending token, a draft verification) go
first, in arrival order; prefills fill the rest of the budget in arrival order, a long one cut
into pieces across steps (only its last piece carries outputs), so a long prompt interleaves
with the running decodes instead of stalling them, as llama-server does. Within each group a
share that got nothing in a step goes first in the next one. A prefill waits only while the
decodes alone fill the budget; a backend that keeps ``parallel * longest decode share`` below
``max_tokens`` (llama.cpp caps its draft length so) leaves room in every step, and the oldest
prefill gets it: no share starves.

**One sequence per step** (``max_sequences=1``): a runtime whose kernels round a row
differently when other rows share its forward pass (llama.cpp's CPU matmuls and attention pick
their kernel by the batch's shape) cannot give a sequence its solo result in a shared step.
With a cap, a step carries at most ``max_sequences`` shares and the shares take turns in
arrival order (one passed over goes first in the next step); a long prefill is still cut at
``max_tokens``, as a lone sequence's would be. The leader then does not wait for a straggler
when the queue already fills a step.

**Row order** (``rows_by_sequence=True``): the pieces a step carries are chosen as above, then
laid out in the batch by ascending sequence id instead of in that order. llama.cpp with one KV
cache per sequence cuts a batch into one forward pass (ubatch) per run of consecutive
increasing sequence ids (``split_equal``), so 8 decode tokens in arrival order such as
``3, 0, 5, 1, 7, 2, 6, 4`` cost four passes of one or two rows where ``0..7`` cost one:
measured on SmolLM2 Q4_1, 2 threads, 62-89 ms against 38-39 ms a step (llama-server lays its
slots out in id order).

**Failures and cancels.** A share whose callback (``on_done`` or the ``cancelled`` probe)
raises fails alone: its submitter gets the exception, the other shares are untouched. When
``decode`` raises, every share in that batch gets the exception (the runtime did not run the
batch). A share whose ``cancelled`` probe turns true is dropped at the next step boundary
(it never reaches another decode, even when some of its pieces already did); its submitter
gets :class:`~eliza_backends.errors.CancelledError`. The backend undoes what the dropped
share's pieces wrote (it knows ``start``).

**Native calls outside steps.** Everything else a backend does to the shared runtime context
(dropping a sequence's positions, copying a prefix, saving its state) must not run while a step
decodes: :meth:`StepScheduler.exclusive` holds the lock the steps hold (re-entrant, so a callback
may use it too).

Stable API (the llama.cpp and MLX plugins build on it; keep it):

* ``StepScheduler(decode, max_tokens, *, gather_window=GATHER_WINDOW_S, max_sequences=None,
  rows_by_sequence=False, stepping_thread=None)``:
  ``decode(pieces)``
  runs one forward pass over a batch of :class:`Piece` (in order; rows are numbered across
  them: see :attr:`Piece.row`) and returns when its outputs can be read.
* ``submit(seq, tokens, start, n_outputs, on_done, cancelled=None) -> R``: blocks until the
  share's last piece was decoded and ``on_done(last_piece)`` ran; returns what it returned.
* ``adopt(job) -> Future | None`` (with a stepping thread: run ``job`` there).
* ``idle(seq)``, ``expect(seq)``, ``exclusive()``, ``close()``, ``closed``, ``queued``,
  ``stats()``,
  ``records`` (the recent :class:`StepRecord`).

Threads: every method is safe from any thread. Only ``decode`` and the callbacks run native
code, one step at a time (with a stepping thread: on that thread). A submitter interrupted
while it waits (``KeyboardInterrupt``) abandons its share: it is dropped at the next step
boundary (or finishes, when a step already carries it) before the interrupt propagates.
"""

from __future__ import annotations

import threading
import time
from collections import Counter, deque
from collections.abc import Callable, Hashable, Iterator, Sequence
from concurrent.futures import Future
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, TypeVar, cast

from ..errors import CancelledError, InvalidArgumentError, SessionClosedError
from .step_records import BatchStats, Piece, StepRecord

R = TypeVar("R")

#: How long the leader waits, at most, for the sequences decoded in the previous step to
#: resubmit before it decodes without them (seconds). Measured with benchmarks/bench_batching.py
#: (SmolLM2-135M Q4_1, 2-8 greedy streams through ``Session.next``, a 2-core machine at load
#: 10-15): the resubmit lag between two decode shares of a stream was p50 0.15-3.7 ms, p90
#: 0.3-6.3 ms, p99 4-36 ms, against steps of 15-130 ms; with 10 ms the window ran out in 1-3 of
#: ~35-50 steps per run and the steps carried 7.3-7.7 of 8 sequences on average. A straggler
#: that misses it costs a step of its own and is not waited for again until it is decoded again.
GATHER_WINDOW_S = 0.010
#: How many recent steps :attr:`StepScheduler.records` keeps.
RECORDS_KEPT = 4096


@dataclass(slots=True, eq=False)
class _Share:
    seq: Hashable
    tokens: list[int]
    start: int
    n_outputs: int
    on_done: Callable[[Piece], Any]
    cancelled: Callable[[], bool] | None
    fed: int = 0
    starved: bool = False
    abandoned: bool = False
    done: bool = False
    result: Any = None
    error: BaseException | None = None
    decode: bool = field(init=False)

    def __post_init__(self) -> None:
        self.decode = self.n_outputs == len(self.tokens)


class StepScheduler:
    """Runs the steps of the sequences that share one runtime context (see the module
    docstring). ``decode(pieces)``: the backend's batched forward pass; ``max_tokens``: the
    most tokens one step may carry (the runtime's batch size); ``gather_window``: seconds the
    leader waits for the expected sequences (default :data:`GATHER_WINDOW_S`; the attribute
    may be changed at any time, the next gather reads it); ``max_sequences``: the most
    sequences one step carries (None: as many as the budget holds; see the module
    docstring); ``rows_by_sequence``: lay each step's pieces out by ascending sequence id
    (the ids must then be mutually orderable; see the module docstring); ``stepping_thread``:
    the name of a thread of the scheduler's own that runs every step (None: the submitters
    take turns as leader; see the module docstring)."""

    def __init__(self, decode: Callable[[Sequence[Piece]], None], max_tokens: int, *,
                 gather_window: float = GATHER_WINDOW_S,
                 max_sequences: int | None = None, rows_by_sequence: bool = False,
                 stepping_thread: str | None = None) -> None:
        if max_tokens < 1:
            raise InvalidArgumentError(f"max_tokens must be >= 1, got {max_tokens}")
        if max_sequences is not None and max_sequences < 1:
            raise InvalidArgumentError(f"max_sequences must be >= 1, got {max_sequences}")
        self._decode = decode
        self.max_tokens = max_tokens
        self.max_sequences = max_sequences
        self.rows_by_sequence = rows_by_sequence
        self.gather_window = gather_window
        self._lock = threading.Lock()
        # the leader waits on arrivals (a share, an idle or a cancelled sequence); submitters
        # wait on progress (a step ended, the leader left, the scheduler closed): so a
        # resubmit wakes the leader only, not every blocked submitter
        self._arrivals = threading.Condition(self._lock)
        self._progress = threading.Condition(self._lock)
        self._native = threading.RLock()  # held by a step's decode + callbacks, and exclusive()
        self._queue: list[_Share] = []  # arrival order
        self._queued: dict[Hashable, _Share] = {}
        self._expected: set[Hashable] = set()
        self._announced: set[Hashable] = set()  # expect(): a share is on its way
        self._waiting_native = 0  # threads blocked entering exclusive()
        self._waiting = 0  # submitters waiting on progress (nobody to wake: no notify)
        self._finished_at: dict[Hashable, float] = {}
        self._leader: int | None = None
        self._closed = False
        self.records: deque[StepRecord] = deque(maxlen=RECORDS_KEPT)
        self._lags: deque[float] = deque(maxlen=RECORDS_KEPT)
        self._sizes: Counter[int] = Counter()
        self._totals = Counter[str]()
        #: the adopted job (at most one), from adopt() until it has run
        self._job: tuple[Callable[[], Any], Future[Any]] | None = None
        self._thread: threading.Thread | None = None
        if stepping_thread is not None:
            self._thread = threading.Thread(target=self._serve, name=stepping_thread,
                                            daemon=True)
            self._thread.start()

    # ------------------------------------------------------------------ public

    @property
    def closed(self) -> bool:
        """True once :meth:`close` ran."""
        return self._closed

    @property
    def queued(self) -> int:
        """Shares waiting for (or in) a step now."""
        return len(self._queue)

    def submit(self, seq: Hashable, tokens: Sequence[int], start: int, n_outputs: int,
               on_done: Callable[[Piece], R], cancelled: Callable[[], bool] | None = None) -> R:
        """Decode ``tokens`` at positions ``start..`` of sequence ``seq`` in the coming steps
        (pieces of at most the budget; the last ``n_outputs`` tokens in the last piece), then
        run ``on_done(last_piece)`` while its outputs are readable and return its result.

        Blocks the calling thread (which may run steps for everyone meanwhile). Raises what
        ``on_done`` or the batch's ``decode`` raised, :class:`CancelledError` when
        ``cancelled()`` turned true before the last piece was decoded, and
        :class:`SessionClosedError` once the scheduler is closed. One share per sequence at a
        time."""
        n = len(tokens)
        if n < 1 or not 0 <= n_outputs <= n or n_outputs > self.max_tokens:
            raise InvalidArgumentError(
                f"a share needs >= 1 token and 0..min({n}, {self.max_tokens}) outputs, got "
                f"{n} tokens and {n_outputs} outputs")
        share = _Share(seq, list(tokens), start, n_outputs, on_done, cancelled)
        with self._lock:
            if self._closed:
                raise SessionClosedError("the batched runtime context is closed; open a new "
                                         "InferenceContext")
            if seq in self._queued:
                raise InvalidArgumentError(f"sequence {seq!r} already has a share queued")
            now = time.perf_counter()
            self._announced.discard(seq)
            finished = self._finished_at.pop(seq, None)
            if finished is not None and share.decode:
                self._lags.append(now - finished)
            self._queue.append(share)
            self._queued[seq] = share
            self._arrivals.notify()
            may_lead = self._thread is None or self._thread.ident == threading.get_ident()
            while not share.done:
                if self._leader is None and may_lead:
                    self._lead(share)
                else:
                    self._wait_for(share)
        if share.error is not None:
            raise share.error
        return cast(R, share.result)

    def adopt(self, job: Callable[[], R]) -> Future[R] | None:
        """Run ``job()`` on the stepping thread (``stepping_thread``), between steps: a
        stream's whole loop of ``next`` calls, whose shares that thread then decodes with no
        hop to another thread. While it runs, the steps run only when it submits (it leads
        them, every queued share included), so a job must not wait for anything but its own
        shares and :meth:`exclusive`. Returns the job's future, or None (run it elsewhere)
        when the scheduler has no thread of its own, is closed, or already runs or holds a
        job (one at a time)."""
        with self._lock:
            if self._thread is None or self._closed or self._job is not None:
                return None
            future: Future[R] = Future()
            self._job = (job, future)
            self._arrivals.notify_all()
            return future

    def idle(self, seq: Hashable) -> None:
        """``seq`` will not submit again soon (its stream ended, it was rewound or closed):
        the next step does not wait for it."""
        with self._lock:
            self._expected.discard(seq)
            self._announced.discard(seq)
            self._finished_at.pop(seq, None)
            self._arrivals.notify_all()

    def expect(self, seq: Hashable) -> None:
        """``seq`` is about to submit (a prefill on its way, after a call between steps): the
        next step waits for it as for a running sequence, at most the gather window, so
        prompts that arrive together are decoded together. :meth:`submit` or :meth:`idle`
        ends the expectation."""
        with self._lock:
            self._announced.add(seq)

    @contextmanager
    def exclusive(self) -> Iterator[None]:
        """Hold the runtime context between steps (no decode runs meanwhile): for the native
        calls a backend makes outside a step. Re-entrant (a callback may use it). Raises
        :class:`SessionClosedError` once the scheduler is closed."""
        with self._lock:
            self._waiting_native += 1
        try:
            self._native.acquire()
        finally:
            with self._lock:
                self._waiting_native -= 1
                self._arrivals.notify_all()
        try:
            if self._closed:
                raise SessionClosedError("the batched runtime context is closed")
            yield
        finally:
            self._native.release()

    def close(self) -> None:
        """Refuse new shares, fail the queued ones with :class:`SessionClosedError` and wait
        for the step in flight (if any) to finish; the backend may free its runtime context
        afterwards. Idempotent."""
        with self._lock:
            self._closed = True
            if self._leader is None:
                self._fail_queued()
            self._arrivals.notify_all()
            self._progress.notify_all()
        with self._native:  # the step in flight ends before this returns
            pass
        thread = self._thread
        if thread is not None and thread.ident != threading.get_ident():
            thread.join()

    def stats(self) -> BatchStats:
        """A snapshot of the totals (see :class:`BatchStats`)."""
        with self._lock:
            t = self._totals
            return BatchStats(steps=t["steps"], tokens=t["tokens"], shares=t["shares"],
                              failed=t["failed"], cancelled=t["cancelled"],
                              waited_out=t["waited_out"], batch_sizes=dict(self._sizes),
                              resubmit_lags=tuple(self._lags))

    # ------------------------------------------------------------------ the leader

    def _wait_for(self, share: _Share) -> None:
        """Wait (lock held) until the leader made progress. Interrupted (a KeyboardInterrupt
        in the waiting thread), the share is abandoned: dropped at the next step boundary,
        waited for until then, and the interrupt raised; a decode never runs the callback of
        a share whose submitter has gone."""
        self._waiting += 1
        try:
            self._progress.wait()
        except BaseException:
            share.abandoned = True
            self._arrivals.notify_all()
            while not share.done:
                try:
                    self._progress.wait()
                except BaseException:  # a second interrupt: still wait, then raise the first
                    continue
            raise
        finally:
            self._waiting -= 1

    def _lead(self, own: _Share | None) -> None:
        """As the leader, run steps until ``own`` is done (None: one step; the stepping
        thread's loop), then hand the role back (called with the lock held; releases it while
        a step decodes)."""
        self._leader = threading.get_ident()
        try:
            if own is None:
                self._step(None)
            while own is not None and not own.done and self._step(own):
                pass
        finally:
            self._leader = None
            self._progress.notify_all()

    def _step(self, own: _Share | None) -> bool:
        """One step (``own``: the leader's share, None on the stepping thread's loop). False
        once the scheduler is closed (the queued shares failed)."""
        if self._closed:
            self._fail_queued()
            return False
        self._drop_cancelled()
        if own is not None and own.done:
            return True
        self._let_native_calls_in()
        gather_s, waited_out = self._gather(own)
        if (own is not None and own.done) or self._closed or not self._queue:
            return True
        plan = self._plan()
        self._lock.release()
        try:
            decode_s = self._run(plan)
        finally:
            self._lock.acquire()
        self._finish(plan, gather_s, waited_out, decode_s)
        return True

    def _serve(self) -> None:
        """The stepping thread: runs adopted jobs, and the steps of the queued shares while no
        job runs (a job leads the steps itself when it submits)."""
        with self._lock:
            while True:
                if self._job is not None:
                    job, future = self._job
                    self._lock.release()
                    try:
                        if future.set_running_or_notify_cancel():
                            try:
                                future.set_result(job())
                            except BaseException as exc:
                                future.set_exception(exc)
                    finally:
                        self._lock.acquire()
                        self._job = None
                elif self._closed:
                    self._fail_queued()
                    return
                elif self._queue and self._leader is None:
                    self._lead(None)
                else:
                    self._arrivals.wait()

    def _let_native_calls_in(self) -> None:
        """Wait (at most the gather window) until the threads blocked entering
        :meth:`exclusive` got in: the leader, already running, would otherwise take the native
        lock for the next step first, again and again, and a request's between-step calls
        (saving an evicted state, copying a prefix) would wait several steps."""
        deadline = time.perf_counter() + self.gather_window
        while self._waiting_native and not self._closed:
            remaining = deadline - time.perf_counter()
            if remaining <= 0:
                return
            self._arrivals.wait(remaining)

    def _gather(self, own: _Share | None) -> tuple[float, bool]:
        """Wait until every expected sequence has a share queued, or the window passed.
        Returns (seconds waited, whether the window ran out with one missing)."""
        t0 = time.perf_counter()
        deadline = t0 + self.gather_window
        while True:
            missing = any(s not in self._queued for s in self._expected) or \
                any(s not in self._queued for s in self._announced)
            if not missing or self._step_full():
                return time.perf_counter() - t0, False
            now = time.perf_counter()
            if now >= deadline:
                self._expected.clear()  # not expected again until decoded again
                self._announced.clear()
                return now - t0, True
            self._arrivals.wait(deadline - now)
            self._drop_cancelled()
            if (own is not None and own.done) or self._closed:
                return time.perf_counter() - t0, False

    def _step_full(self) -> bool:
        """The queue already holds as many shares as a step may carry."""
        return self.max_sequences is not None and len(self._queue) >= self.max_sequences

    def _plan(self) -> list[tuple[_Share, Piece]]:
        """This step's pieces within the token budget: decodes, then prefills, each group in
        arrival order except that a share that got nothing in the last step goes first (with
        ``max_sequences``: up to that many shares, in arrival order, passed-over ones first).
        The chosen pieces are laid out in that order, or by ascending sequence id with
        ``rows_by_sequence``."""
        cap = self.max_sequences
        queue = self._queue
        order = queue if len(queue) == 1 else \
            sorted(queue, key=lambda s: (not s.decode, not s.starved)) if cap is None \
            else sorted(queue, key=lambda s: not s.starved)  # turns, in arrival order
        budget = self.max_tokens
        chosen: list[tuple[_Share, int, bool]] = []  # (share, tokens this step, final)
        for share in order:
            if cap is not None and len(chosen) >= cap:
                share.starved = True
                continue
            rest = len(share.tokens) - share.fed
            final = rest <= budget
            n = rest if final else min(budget, rest - share.n_outputs)
            if n <= 0:
                share.starved = True
                continue
            share.starved = False
            chosen.append((share, n, final))
            budget -= n
        if self.rows_by_sequence and len(chosen) > 1:
            chosen.sort(key=lambda c: cast(Any, c[0].seq))
        plan: list[tuple[_Share, Piece]] = []
        row = 0
        for share, n, final in chosen:
            piece = Piece(share.seq, share.tokens[share.fed:share.fed + n],
                          share.start + share.fed, share.n_outputs if final else 0, row,
                          len(plan), final)
            plan.append((share, piece))
            row += n
        return plan

    def _run(self, plan: list[tuple[_Share, Piece]]) -> float:
        """Decode the batch, then run the callbacks of the shares it finished (lock released;
        the native lock held). Returns the decode's time in seconds."""
        with self._native:
            if self._closed:  # closed between planning and now: the context may be freed
                err = SessionClosedError("the batched runtime context was closed")
                for share, _piece in plan:
                    share.error = err
                return 0.0
            t0 = time.perf_counter()
            try:
                self._decode([piece for _, piece in plan])
            except BaseException as exc:
                for share, _piece in plan:
                    share.error = exc
                return time.perf_counter() - t0
            decode_s = time.perf_counter() - t0
            for share, piece in plan:
                share.fed += len(piece.tokens)
                if piece.final:
                    try:
                        share.result = share.on_done(piece)
                    except BaseException as exc:
                        share.error = exc
            return decode_s

    def _finish(self, plan: list[tuple[_Share, Piece]], gather_s: float, waited_out: bool,
                decode_s: float) -> None:
        """Mark the step's finished shares done, record the step, wake the submitters."""
        now = time.perf_counter()
        totals = self._totals
        expected: set[Hashable] = set()
        tokens = decodes = prefill_tokens = 0
        for share, piece in plan:
            n = len(piece.tokens)
            tokens += n
            if share.decode:
                decodes += 1
            else:
                prefill_tokens += n
            if share.error is not None or piece.final:
                self._retire(share)
                if share.error is not None:
                    totals["failed"] += 1
                else:
                    totals["shares"] += 1
                    expected.add(share.seq)
                    if share.decode:
                        self._finished_at[share.seq] = now
        self._expected = expected
        self.records.append(StepRecord(len(plan), tokens, decodes, prefill_tokens, gather_s,
                                       waited_out, decode_s))
        self._sizes[len(plan)] += 1
        totals["steps"] += 1
        totals["tokens"] += tokens
        totals["waited_out"] += waited_out
        if self._waiting:
            self._progress.notify_all()

    def _retire(self, share: _Share) -> None:
        share.done = True
        self._queue.remove(share)
        if self._queued.get(share.seq) is share:
            del self._queued[share.seq]

    def _drop_cancelled(self) -> None:
        """Retire the shares whose ``cancelled`` probe is true (:class:`CancelledError`) or
        raises (that exception, for that share alone)."""
        for share in list(self._queue):
            if share.cancelled is None and not share.abandoned:
                continue
            try:
                if not share.abandoned and not (share.cancelled and share.cancelled()):
                    continue
                share.error = CancelledError(f"sequence {share.seq!r} was cancelled before "
                                             "its share was decoded")
                self._totals["cancelled"] += 1
            except BaseException as exc:  # the plugin's probe failed: its share fails alone
                share.error = exc
                self._totals["failed"] += 1
            self._retire(share)
            self._expected.discard(share.seq)
            self._progress.notify_all()

    def _fail_queued(self) -> None:
        err = SessionClosedError("the batched runtime context was closed; open a new "
                                 "InferenceContext")
        for share in list(self._queue):
            share.error = err
            self._retire(share)
        self._progress.notify_all()


__all__ = ["GATHER_WINDOW_S", "BatchStats", "Piece", "StepRecord", "StepScheduler"]
