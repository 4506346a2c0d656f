"""Continuous batching on llama.cpp: sessions sharing one ``llama_context``, one sequence each.

On an :class:`~eliza_backends.InferenceContext` made with ``parallel=N``, the sessions with the
same model and context settings share one :class:`BatchEngine`: a ``llama_context`` of ``N``
sequences (``n_seq_max = N``), each with a KV cache of its own of ``context_size`` cells
(``kv_unified = false``, as llama-server's ``-np N``): a sequence's cells sit exactly where
they would if it were alone (with one unified cache, where a sequence's cells fall among the
others', SmolLM2 Q4_1 kept 14 of 24 batched chat replies equal to the solo ones; the option
``kv_unified=True`` keeps it, and a copied prefix then shares cells instead of being copied).
Each session owns one sequence id (a :class:`SharedLane`) and asks the engine's
:class:`~eliza_backends.backend.StepScheduler` for its decodes.

**One forward pass per step.** With per-sequence caches llama.cpp cuts a batch into one ubatch
(one pass over the weights) per run of consecutive increasing sequence ids
(``llama_batch_allocr::split_equal``, sequential): 8 decode tokens in arrival order took 1.6-2.3x
the time of the same 8 in id order (SmolLM2 Q4_1, 2 threads: 62-89 ms against 38-39 ms a step;
``benchmarks/batch_row_order.py``). So the scheduler lays each step out by sequence id
(``rows_by_sequence``), and a new session gets the lowest free id, so the live ids stay one run
(llama-server lays its slots out in id order and gives a request the first free slot).

**Batch invariance** (option ``batch_invariant``; by default on for weights whose matmul kernel
changes between one row and two, :func:`batch_invariant`): each step, one
``llama_decode``, carries one sequence's tokens, the sequences taking turns, and a long prefill
goes in pieces of the batch size from its start, as a lone context cuts it. llama.cpp's CPU
kernels choose their path by the batch's shape (llamafile's tinyBLAS for f32/f16/bf16/Q8_0/
Q4_0/Q5_0/IQ4_NL weights from 2 rows, ``vec_dot`` for 1; the tiled K-quant/IQ matmul from 8
rows; flash attention tiled from 64 rows of one sequence, split over the KV cells for one row
alone of >= 512 cells), so a row decoded beside other sequences' rows rounds differently and a
greedy reply leaves its solo one at a near-tie (gemma4-mm-tiny, f32: a 0.0009-nat tie flipped
in one of three prompts, every run; Gemma 3 Q4_K_M: 15 of 24 equal). One sequence per step
meets exactly the kernels it meets alone: every reply equals its solo reply bit for bit.
Quantized weights other than Q4_0/Q5_0/Q8_0/IQ4_NL take ``vec_dot`` or a kernel whose decode
rows measured bit-identical beside 1-7 other sequences, so they share steps by default
(K-quants reach llama.cpp's tiled matmul in a pass of 8 rows: Gemma 3 Q4_K_M agreed 11-15 of 24
in 8-sequence steps, llama-server 11 of 24; docs/guides/openai-server.md).
With ``batch_invariant=False`` the scheduler puts every sequence that wants tokens into one
``llama_decode`` per step and cuts long prefills into pieces that ride along with the running
decodes: the throughput of continuous batching, with that rounding. Sampling, stop tokens,
constraints, logprobs and drafting stay with each session (they run in the decode's
callback, on its own rows).

Every other call on the shared context (dropping a sequence's positions, copying a prefix,
saving or loading a sequence's state) runs between steps (``scheduler.exclusive()``).

**One decoding thread.** The scheduler's leader is whichever session thread came first, so the
thread that would call ``llama_decode`` changes from step to step and from request to request.
llama.cpp's CPU backend (OpenMP) keeps a team of worker threads per calling thread, and a team
whose master moved on keeps spinning for a while: measured on SmolLM2 Q4_1 with 2 threads,
16 requests rotating over 8 calling threads took 7.9 s against 4.1 s from one thread, and
``serve --parallel 8`` served one client at 0.56x of ``--sessions 1``. So the engine's
scheduler has a stepping thread of its own (``eliza-llamacpp-steps``) that makes every
``llama_decode`` of the context; a server's streamed answer runs its whole loop there
(:meth:`~eliza_backends.backend.StepScheduler.adopt`), with no hop between threads per token.
A media block (libmtmd's encoder and its embeddings' decode) runs on its session's thread,
between steps: the stepping thread may be running a stream that waits for those steps.

**Shared prefixes.** A prefill that starts where its sequence's cache ends looks for the live
sequence whose cached tokens share the longest prefix with the new sequence and copies those
positions (``llama_memory_seq_cp``; across per-sequence caches llama.cpp copies a whole cache,
so the copy is cut back to the shared prefix after) instead of decoding them: a system prompt
or a few-shot header is decoded once. The engine keeps every sequence's cached tokens for
that (updated only when a decode succeeded, cut when positions are dropped), copies only
whole positions ``0..k-1`` of a sequence that still holds all of them (a sliding-window cache
that pruned old positions is never copied from), and always decodes at least the last prompt
token (its logits are needed). Models with recurrent state do not share. With
``batch_invariant`` a copy must also be what a lone context would compute: only into a
sequence that starts at position 0, and only the source's first whole batches from position 0
(a lone context decodes a longer prompt in those same pieces; a shorter piece's rows took other
kernels), so a shared system prompt shorter than the batch size is decoded by each sequence.
A sequence's slot state is kept in one-stream form whatever the layout
(:mod:`eliza_llamacpp.kv_streams`).

A copy across per-sequence caches is made late: ``llama_memory_seq_cp`` only queues it, and the
source's whole cache is copied at the start of the next ``llama_decode``. A state loaded into
the source before then (the prompt cache restoring another conversation into that slot, on
another request's thread) would be what the copy gets, and the copy's replies would read
another conversation's cells (``benchmarks/server_rotation_agreement.py``); a state loaded into
the copy would be overwritten, and one saved from it would be stale. So until that decode a
slot load into either sequence is refused (the sequence is left empty and prefills again, as
after any refused load) and a slot save of the copy fails. Copying the state at once instead
(``llama_state_seq_get_data`` / ``set_data``) gives replies that differ from a lone context's
(tests/test_batch_invariance.py), so the copy stays llama.cpp's.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from typing import Any, TypeVar, cast

from eliza_backends import (
    BackendRuntimeError,
    InferenceContext,
    SessionBusyError,
    SessionClosedError,
    StreamConfig,
)
from eliza_backends.backend import Piece, StepScheduler, cpu_count

from .bindings import lc
from .kv_streams import to_one_stream, to_streams
from .lane import TargetLinkedDrafter
from .llama_context import Outputs, load_seq, new_context, save_seq
from .model import ROW_SENSITIVE_FILE_TYPES, LoadedModel, file_type, use_extra_buffers
from .options import LlamaCppOptions

R = TypeVar("R")


class BatchEngine:
    """One ``llama_context`` of ``parallel`` sequences and the scheduler of its steps (see the
    module docstring). Owned by the :class:`InferenceContext` (closed after its sessions);
    safe from any thread."""

    def __init__(self, model: LoadedModel, config: StreamConfig, options: LlamaCppOptions,
                 parallel: int) -> None:
        self.parallel = parallel
        self.ctx: Any = new_context(model, config, f"a batched context of {parallel} sequences",
                                    n_ubatch=options.n_ubatch,
                                    flash_attention=options.flash_attention,
                                    kv_cache_type=options.kv_cache_type, n_seq=parallel,
                                    kv_unified=options.kv_unified)
        self.unified = options.kv_unified
        self.mem = lc.llama_get_memory(self.ctx)
        self.n_batch: int = lc.llama_n_batch(self.ctx)
        #: Positions one sequence may use (the sessions' context window).
        self.n_ctx_seq = config.context_size
        self._batch: Any = lc.llama_batch_init(self.n_batch, 0, 1)
        #: One sequence per ``llama_decode`` (batch invariance; module docstring).
        self.invariant = batch_invariant(model, options)
        #: (rows by sequence id: one forward pass per step with per-sequence caches; module
        #: docstring)
        #: (every step on the scheduler's own thread: one thread makes every
        #: ``llama_decode`` of this context; module docstring)
        self.scheduler = StepScheduler(self._decode, self.n_batch,
                                       max_sequences=1 if self.invariant else None,
                                       rows_by_sequence=True,
                                       stepping_thread="eliza-llamacpp-steps")
        self._lock = threading.Lock()  # the sequence ids
        self._free = list(range(parallel))
        #: Each live sequence's cached tokens (positions 0..len-1), for shared prefixes.
        self.cached: dict[int, list[int]] = {}
        #: Each live sequence's decoded pieces (start, length) in order, from position 0 (a
        #: negative length: positions a lone context may compute otherwise, as media).
        self.pieces: dict[int, list[tuple[int, int]]] = {}
        self._share = not (lc.llama_model_is_recurrent(model.ptr)
                           or lc.llama_model_is_hybrid(model.ptr))
        #: Streams of the KV state a sequence's slot is converted from and to (one per
        #: sequence; 1: no conversion), so slots restore across layouts (see kv_streams).
        self.slot_streams = parallel if not self.unified and self._share and \
            lc.llama_model_n_swa(model.ptr) == 0 else 1
        #: Tokens decoded, and prompt tokens copied from another sequence instead, since the
        #: engine opened.
        self.decoded = 0
        self.prefill_copied = 0
        #: The (source, copy) sequences of the cross-cache prefix copies llama.cpp has yet to
        #: make (at the next ``llama_decode``; module docstring): neither may load a state
        #: before then, nor a copy save one.
        self.pending_copies: list[tuple[int, int]] = []

    # ------------------------------------------------------------------ sequences

    def open_lane(self) -> SharedLane:
        """A free sequence of the context. :class:`SessionBusyError` when all ``parallel`` are
        in use."""
        with self._lock:
            if self.scheduler.closed:
                raise SessionClosedError("the batched context is closed; open a new "
                                         "InferenceContext")
            if not self._free:
                raise SessionBusyError(
                    f"all {self.parallel} sequences of this batched context are in use: close "
                    f"a stream first, or make the InferenceContext with a larger parallel")
            seq = min(self._free)  # the lowest: live ids stay one run (module docstring)
            self._free.remove(seq)
            self.cached[seq] = []
            self.pieces[seq] = []
        return SharedLane(self, seq)

    def release(self, seq: int) -> None:
        """Free sequence ``seq`` (its positions dropped) for the next session."""
        self.scheduler.idle(seq)
        try:
            with self.scheduler.exclusive():
                lc.llama_memory_seq_rm(self.mem, seq, -1, -1)
                self.cached[seq] = []
                self.pieces[seq] = []
        except SessionClosedError:
            pass  # the context is gone with everything in it
        with self._lock:
            self.cached.pop(seq, None)
            self.pieces.pop(seq, None)
            if seq not in self._free:
                self._free.append(seq)

    @property
    def active(self) -> int:
        """Sequences in use."""
        return self.parallel - len(self._free)

    def share_prefix(self, seq: int, tokens: Sequence[int], start: int) -> int:
        """Copy the longest prefix of ``cached[seq] + tokens`` (beyond ``start``, short of its
        last token) that another sequence holds into ``seq``; returns the new start. Call
        under ``scheduler.exclusive()``. With ``batch_invariant`` only into a sequence that
        starts from position 0, and only the whole pieces a lone context would decode the
        same (:meth:`_solo_pieces`): the cells are then bit for bit the ones it would compute."""
        if not self._share or (self.invariant and start):
            return start
        mine = self.cached[seq]
        if len(mine) != start:
            return start
        full = [*mine, *tokens]
        limit = len(full) - 1  # the last token is decoded: its logits are needed
        best, src = start, -1
        for other, held in list(self.cached.items()):
            if other == seq or len(held) <= best:
                continue
            n = _common_prefix(held, full, limit)
            if self.invariant:
                n = self._solo_pieces(other, n)
            if n > best and lc.llama_memory_seq_pos_min(self.mem, other) == 0:
                best, src = n, other
        if src < 0:
            return start
        if self.unified:
            lc.llama_memory_seq_cp(self.mem, src, seq, start, best)
        else:  # across per-sequence caches llama.cpp copies whole caches only: copy, then cut
            lc.llama_memory_seq_cp(self.mem, src, seq, -1, -1)
            lc.llama_memory_seq_rm(self.mem, seq, best, -1)
            self.pending_copies.append((src, seq))
        mine.extend(full[start:best])
        self.pieces[seq] = list(self.pieces[src])
        self.cut_pieces(seq, best)
        self.prefill_copied += best - start
        return best

    def _solo_pieces(self, seq: int, n: int) -> int:
        """The end (<= ``n``) of ``seq``'s first pieces that are whole batches from position
        0, ``[0, B), [B, 2B), ...``: the pieces a lone context decodes a longer prompt in, so
        their cells are its cells. A shorter piece is left out: its rows took other kernels
        (module docstring)."""
        end = 0
        for start, length in self.pieces[seq]:
            if start != end or length != self.n_batch or end + length > n:
                break
            end += length
        return end

    def cut_pieces(self, seq: int, p0: int) -> None:
        """Forget ``seq``'s pieces from position ``p0`` (a piece cut short no longer counts
        as whole)."""
        self.pieces[seq] = [(a, n if a + n <= p0 else -(p0 - a))
                            for a, n in self.pieces[seq] if a < p0]

    # ------------------------------------------------------------------ steps

    def _decode(self, pieces: Sequence[Piece]) -> None:
        """The scheduler's batched forward pass: every piece into one ``llama_batch``."""
        batch, i = self._batch, 0
        token, pos, n_seq_id, seq_id, logits = (batch.token, batch.pos, batch.n_seq_id,
                                                batch.seq_id, batch.logits)
        for piece in pieces:
            seq, start = piece.seq, piece.start
            first_out = len(piece.tokens) - piece.n_outputs
            for j, tok in enumerate(piece.tokens):
                token[i] = tok
                pos[i] = start + j
                n_seq_id[i] = 1
                seq_id[i][0] = seq
                logits[i] = j >= first_out
                i += 1
        batch.n_tokens = i
        self.decoded += i
        status = lc.llama_decode(self.ctx, batch)
        if status == 0:
            self.pending_copies.clear()  # (made by this decode's cache update)
        if status:
            raise BackendRuntimeError(
                f"llama_decode failed with status {status} on a batch of {len(pieces)} "
                "sequences" + (" (no KV slot: the shared cache is full)" if status == 1 else ""))
        for piece in pieces:
            self.pieces[cast(int, piece.seq)].append((piece.start, len(piece.tokens)))

    def close(self) -> None:
        """Fail what is queued, wait for the step in flight, free the context (idempotent)."""
        self.scheduler.close()
        with self._lock:
            if self._batch is not None:
                lc.llama_batch_free(self._batch)
                self._batch = None
            if self.ctx is not None:
                lc.llama_free(self.ctx)
                self.ctx = None


def _common_prefix(a: Sequence[int], b: Sequence[int], limit: int) -> int:
    n = min(len(a), len(b), limit)
    for i in range(n):
        if a[i] != b[i]:
            return i
    return n


def batch_invariant(model: LoadedModel, options: LlamaCppOptions) -> bool:
    """Whether ``model``'s batched context decodes one sequence per ``llama_decode``: the
    ``batch_invariant`` option when given, else True for weights whose matmul kernel changes
    between one row and two (:data:`~eliza_llamacpp.model.ROW_SENSITIVE_FILE_TYPES`, and a
    file that does not say), False for the others (module docstring)."""
    if options.batch_invariant is not None:
        return options.batch_invariant
    kind = file_type(model)
    return kind is None or kind in ROW_SENSITIVE_FILE_TYPES


def shared_engine(context: InferenceContext, model: LoadedModel, config: StreamConfig,
                  options: LlamaCppOptions) -> BatchEngine:
    """The engine of ``context`` for ``model`` and the settings that must match to share one
    ``llama_context`` (threads, context and batch sizes, KV cache and flash attention).
    A ``batch_size`` below ``context.parallel`` is refused first (llama.cpp would abort)."""
    context.check_batch_size(config.batch_size)
    key = ("llama.cpp-batched", str(model.path), config.threads or cpu_count(),
           config.context_size, config.batch_size, options.n_ubatch, options.flash_attention,
           options.kv_cache_type, options.n_gpu_layers, use_extra_buffers(options),
           options.kv_unified, options.batch_invariant, context.parallel)
    engine = context.shared(key, lambda: BatchEngine(model, config, options, context.parallel),
                            BatchEngine.close)
    context.track_scheduler(engine.scheduler)
    return engine


class SharedLane:
    """One sequence of a :class:`BatchEngine` (see :class:`eliza_llamacpp.lane.Lane`): its
    decodes are shares of the engine's steps; everything else runs between steps."""

    batched = True
    keeps_logits = False
    #: (a cancelled sequence is dropped between steps; no drafter reads a shared context)
    abort: Any = None
    linked: TargetLinkedDrafter | None = None

    def __init__(self, engine: BatchEngine, seq: int) -> None:
        self.engine = engine
        self.seq = seq
        self.ctx: Any = engine.ctx
        self.n_batch = engine.n_batch
        self.n_ctx = engine.n_ctx_seq
        #: (a step of one sequence verifies as a lone context does; shared steps leave room
        #: for every sequence's verify)
        self.draft_cap = engine.n_batch - 1 if engine.invariant else \
            max(1, (engine.n_batch - 1) // engine.parallel - 1)
        self.scheduler: StepScheduler | None = engine.scheduler
        self._closed = False

    def decode(self, tokens: list[int], start: int, outputs: Outputs,
               then: Callable[[int], R], cancelled: Callable[[], bool]) -> R:
        """See :meth:`eliza_llamacpp.lane.Lane.decode`. A prefill (``"last"``) first copies
        the prefix another sequence holds."""
        engine, seq = self.engine, self.seq
        if outputs == "last" and len(tokens) > 1:
            engine.scheduler.expect(seq)  # (prompts arriving together share a step)
            with engine.scheduler.exclusive():
                new_start = engine.share_prefix(seq, tokens, start)
            tokens, start = tokens[new_start - start:], new_start
        n_out = len(tokens) if outputs == "all" else int(outputs == "last")
        cached = engine.cached[seq]

        def done(piece: Piece) -> R:
            del cached[start:]
            cached.extend(tokens)
            return then(piece.last_row)

        return engine.scheduler.submit(seq, tokens, start, n_out, done, cancelled)

    def media(self, start: int, run: Callable[[Any, int, int], int], mark: int) -> int:
        """See :meth:`eliza_llamacpp.lane.Lane.media`: between steps, on the calling thread
        (the stepping thread may be running a stream that waits for these steps); the
        positions are cached as ``mark``."""
        engine, seq = self.engine, self.seq
        with engine.scheduler.exclusive():
            end = run(engine.ctx, seq, start)
            cached = engine.cached[seq]
            del cached[start:]
            cached.extend([mark] * (end - start))
            engine.cut_pieces(seq, start)
            engine.pieces[seq].append((start, start - end))
        return end

    def drop(self, p0: int) -> bool:
        """See :meth:`eliza_llamacpp.lane.Lane.drop`."""
        engine = self.engine
        with engine.scheduler.exclusive():
            del engine.cached[self.seq][p0:]
            engine.cut_pieces(self.seq, p0)
            return bool(lc.llama_memory_seq_rm(engine.mem, self.seq, p0, -1))

    def clear(self) -> None:
        """See :meth:`eliza_llamacpp.lane.Lane.clear`."""
        self.engine.scheduler.idle(self.seq)
        self.drop(0)

    def pos_max(self) -> int:
        """See :meth:`eliza_llamacpp.lane.Lane.pos_max`."""
        engine = self.engine
        with engine.scheduler.exclusive():
            return int(lc.llama_memory_seq_pos_max(engine.mem, self.seq))

    def pos_min(self) -> int:
        """See :meth:`eliza_llamacpp.lane.Lane.pos_min`."""
        engine = self.engine
        with engine.scheduler.exclusive():
            return int(lc.llama_memory_seq_pos_min(engine.mem, self.seq))

    def save(self) -> memoryview:
        """See :meth:`eliza_llamacpp.lane.Lane.save`; empty while the sequence awaits a prefix
        copy (module docstring)."""
        engine = self.engine
        with engine.scheduler.exclusive():
            if any(copy == self.seq for _, copy in engine.pending_copies):
                return memoryview(b"")
            state = save_seq(engine.ctx, self.seq)
        return to_one_stream(state, engine.slot_streams, self.seq)

    def load(self, state: bytes | memoryview, tokens: Sequence[int]) -> bool:
        """See :meth:`eliza_llamacpp.lane.Lane.load`; refused while a prefix copy from or into
        the sequence is pending (module docstring)."""
        engine, seq = self.engine, self.seq
        with engine.scheduler.exclusive():
            cached = engine.cached[seq]
            cached.clear()
            engine.pieces[seq] = []  # (loaded cells: not known to be a lone context's)
            lc.llama_memory_seq_rm(engine.mem, seq, -1, -1)
            if any(seq in pair for pair in engine.pending_copies) or \
                    not load_seq(engine.ctx, seq, to_streams(state, engine.slot_streams)):
                lc.llama_memory_seq_rm(engine.mem, seq, -1, -1)
                return False
            n = int(lc.llama_memory_seq_pos_max(engine.mem, seq)) + 1
            cached.extend(tokens[:n])
            return True

    def idle(self) -> None:
        """See :meth:`eliza_llamacpp.lane.Lane.idle`."""
        self.engine.scheduler.idle(self.seq)

    def batch_cost(self, token: int, n_kv: int, max_n: int) -> list[float] | None:
        """None: a verify rides in a batch with the other sequences' tokens, its cost is not
        its own (the draft policy keeps the configured draft length)."""
        return None

    def close(self) -> None:
        """Give the sequence back to the engine (idempotent)."""
        if not self._closed:
            self._closed = True
            self.engine.release(self.seq)


__all__ = ["BatchEngine", "SharedLane", "shared_engine"]
