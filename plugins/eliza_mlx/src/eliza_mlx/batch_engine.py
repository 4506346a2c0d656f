"""Continuous batching on mlx-lm: the sessions of one ``parallel > 1`` context share one batched
forward pass per step, each sequence keeping its own KV cache state.

**Why not ``BatchGenerator``.** mlx-lm's ``BatchGenerator`` (and ``batch_generate`` on it) owns
the whole generation loop: sequences are inserted with their prompts and then advance together,
one token per ``next()`` for every sequence in the batch, with sampling, logits processors, stop
sequences and ``max_tokens`` inside it and a token sampled on the device one step ahead. The
Session contract gives each sequence to its own consumer: ``next(n)`` makes exactly ``n``
tokens and returns, the consumer may then prefill a new turn, ``reset_keep``, cancel or idle
for as long as it likes; sampling is the core's (per-session seeded generator, the ``_guide``
logits hook for constraints and logprobs, run on the host between two forward passes). Inside
``BatchGenerator`` a sequence cannot pause while the others run (every live uid gets a token
per ``next()``), cannot be trimmed alone (its ``BatchKVCache.trim`` cuts every row) and cannot
take a new prompt without ``remove(..., return_prompt_caches=True)`` and a fresh ``insert``; a
host-side constraint would have to run inside a logits processor, before a sampler that draws
from mlx's process-global PRNG (so a sampled row's tokens would depend on its batch-mates). So
this module drives the model itself, with mlx-lm's own batched cache (``BatchKVCache``: left
padding, per-row offsets, ``merge`` / ``extend`` / ``filter`` / ``extract``), the seam mlx-lm's
``GenerationBatch`` uses under ``BatchGenerator``.

**How a step runs.** A session's forward request (the ids to feed) is a *share* submitted to
the core's :class:`~eliza_backends.runtime.batching.StepScheduler` of its context's
:class:`BatchEngine` (the same scheduler the llama.cpp plugin uses: a leader thread, a gather
window for the rows of the previous step, decodes first, cancel at step boundaries). The
engine's ``decode`` runs each step's pieces on the MLX thread:

* one-token pieces (decoding, and the last token of a prompt) of up to ``parallel`` rows go
  through **one** batched forward over a ``BatchKVCache`` per layer, whose rows are exactly
  the sequences of this step (*live* rows); the logits come back as one float32 host array
  and each session samples its own row;
* longer pieces (a prompt's body, in ``batch_size`` chunks: the budget fits one chunk per row,
  so the scheduler never cuts one) run alone on the row's own single-sequence caches
  (``KVCache`` per layer) with only the cache state evaluated, as ``generate_step`` prefills:
  no padded compute, and a long prompt costs the decoders at most one chunk per step (chunked
  prefill interleaved with decoding). The prompt's last token is fed alone (a one-token
  piece), as the unbatched session does, so its logits are computed the same way.

A row between steps is either *live* (a row of the batched cache) or *at rest* (its own
``KVCache`` list). A step whose rows differ from the previous one's moves rows: leaving rows
are ``extract``-ed to rest and the batch ``filter``-ed, joining rows are ``merge``-d and the
batch ``extend``-ed (a copy of the moved KV). Trims (a rewind, ``reset_keep``, a rolled-back
prefill) act on a row at rest, so one sequence is never cut with the others.

**Sliding windows.** Every layer gets a full-length cache, sliding-window layers too: mlx-lm's
masks (``create_causal_mask(..., window_size, left_padding)`` in the batch, the ``KVCache``
mask at rest) cut the window by position, which is exact because a row's tokens are always
contiguous and right-aligned. ``RotatingKVCache`` rows cannot be batched this way (mlx-lm's
``BatchRotatingKVCache`` refuses single-token steps with right padding, and a ring buffer's
window would move with padding), so memory grows with the context instead of the window.
Models whose caches are neither (SSM ``ArraysCache``, ``ChunkedKVCache``, ``CacheList``,
``RotatingKVCache`` with kept tokens) are not batched: :func:`unbatchable` says why and the
factory opens ordinary sessions (``capabilities.batched`` False).

Threads: :meth:`BatchEngine.forward` is called from session consumer threads (any number);
every mlx call runs on the MLX thread (:mod:`eliza_mlx.mlx_thread`), so steps and row moves
never overlap. A row belongs to one session, which calls at most one engine method at a time.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, cast

import mlx.core as mx  # type: ignore[import-not-found,unused-ignore]
import numpy as np
from mlx_lm.models.cache import (  # type: ignore[import-not-found,unused-ignore]
    BatchKVCache,
    KVCache,
    RotatingKVCache,
    make_prompt_cache,
)

from eliza_backends import (
    BackendRuntimeError,
    ElizaError,
    SessionBusyError,
    SessionClosedError,
)
from eliza_backends.backend import Piece, StepScheduler

from .mlx_thread import MLX_THREAD, on_mlx_thread
from .model import COMPUTE_STREAM, LoadedMLX


def unbatchable(model: Any) -> str | None:
    """Why this model's sessions cannot share a batched step (None: they can)."""
    for cache in make_prompt_cache(model):
        if type(cache) is KVCache:
            continue
        if type(cache) is RotatingKVCache and getattr(cache, "keep", 0) == 0:
            continue
        return f"its {type(cache).__name__} layers have no batched form here"
    return None


@dataclass(eq=False)
class Row:
    """One sequence of the engine: its KV cache at rest (None while live in the batch) and
    how many positions the cache holds. Owned by one session."""

    cache: list[Any] | None
    n_kv: int = 0
    closed: bool = False
    stale: bool = False  # a step failed with the row in it: only reset() helps


@dataclass
class EngineStats:
    """Counters since the engine was made: steps with a batched forward, rows in them (their
    sum: ``rows / batched_steps`` is the mean batch width), widest step, solo prefill chunks,
    rows moved between the batch and rest."""

    batched_steps: int = 0
    rows: int = 0
    widest: int = 0
    solo_chunks: int = 0
    moves: int = 0
    widths: dict[int, int] = field(default_factory=dict)


class BatchEngine:
    """The batched model of one context: rows (sequences), the step scheduler, the live
    batch. Made once per context and weights (``InferenceContext.shared``)."""

    def __init__(self, loaded: LoadedMLX, parallel: int, chunk: int) -> None:
        self.model = loaded.model
        self.parallel = parallel
        self._n_layers = len(make_prompt_cache(loaded.model))
        self._live: list[Row] = []  # rows of the batched cache, in its row order
        self._batch: list[Any] = []  # one BatchKVCache per layer over _live
        self._outputs: dict[int, np.ndarray] = {}  # id(row) -> logits of its one-token piece
        self._open = 0  # rows not closed (at most parallel)
        self.stats = EngineStats()
        #: The core's step scheduler (gather window, decodes first, cancel at step bounds).
        #: Its budget fits every row's decode token and one prompt chunk per row, so a chunk
        #: is never cut (chunks run alone: no padded compute to bound).
        self.scheduler = StepScheduler(self._decode, parallel * (chunk + 1))

    # ------------------------------------------------------------------ rows

    def _fresh(self) -> list[Any]:
        return [KVCache() for _ in range(self._n_layers)]  # type: ignore[no-untyped-call,unused-ignore]

    @on_mlx_thread
    def open_row(self) -> Row:
        """A new, empty sequence. :class:`SessionBusyError` when ``parallel`` are open (as on
        the llama.cpp plugin: a context of ``parallel`` sequences)."""
        if self.scheduler.closed:
            raise SessionClosedError("the batched context is closed; open a new "
                                     "InferenceContext")
        if self._open >= self.parallel:
            raise SessionBusyError(
                f"all {self.parallel} sequences of this batched context are in use: close a "
                "stream first, or make the InferenceContext with a larger parallel")
        self._open += 1
        return Row(self._fresh())

    @on_mlx_thread
    def trim(self, row: Row, n: int) -> None:
        """Drop the last ``n`` positions of ``row`` (``n <= row.n_kv``)."""
        self._rest([row])
        assert row.cache is not None
        for cache in row.cache:
            if cache.trim(n) != n:
                row.stale = True
                raise BackendRuntimeError("the MLX cache could not be trimmed")
        row.n_kv -= n

    @on_mlx_thread
    def reset(self, row: Row) -> None:
        """Empty ``row``'s cache."""
        self._drop([row])
        row.cache, row.n_kv, row.stale = self._fresh(), 0, False

    @on_mlx_thread
    def close_row(self, row: Row) -> None:
        """Free ``row`` (the session closes)."""
        if not row.closed:
            self._open -= 1
        row.closed = True
        self._drop([row])
        row.cache = None

    # ------------------------------------------------------------------ steps

    def forward(self, row: Row, ids: list[int],
                cancelled: Callable[[], bool] | None = None) -> np.ndarray | None:
        """Feed ``ids`` after ``row``'s cached positions in a coming step; the float32 logits
        row of the last id when ``ids`` is one id, else None (a prompt chunk, whose logits
        nobody samples). Blocks the calling (consumer) thread until the step ran (it may lead
        steps for every row meanwhile: :class:`StepScheduler`). ``cancelled``: the session's
        probe; a cancelled share is dropped at the next step boundary
        (:class:`CancelledError`), and the caller trims what its pieces wrote."""
        if row.stale:
            raise BackendRuntimeError("the MLX cache was lost by a failed batched step; call "
                                      "reset() first")
        if len(ids) == 1:
            return self.scheduler.submit(row, ids, row.n_kv, 1, self._output, cancelled)
        return self.scheduler.submit(row, ids, row.n_kv, 0, _no_output, cancelled)

    def idle(self, row: Row) -> None:
        """``row`` will not step again soon (its stream ended, it was rewound): the next step
        does not wait for it."""
        self.scheduler.idle(row)

    def close(self) -> None:
        """Refuse new steps (the context closes); the step in flight finishes first."""
        self.scheduler.close()

    def _output(self, piece: Piece) -> np.ndarray:
        """The logits row of a one-token piece (on_done: right after its step)."""
        return self._outputs.pop(id(piece.seq))

    def _decode(self, pieces: Sequence[Piece]) -> None:
        """The scheduler's batched forward: one batched pass over the one-token pieces, then
        the prompt chunks alone. Runs on the MLX thread."""
        try:
            MLX_THREAD.run(lambda: self._run(pieces))
        except ElizaError:
            raise
        except Exception as exc:
            raise BackendRuntimeError(f"the batched MLX step failed: {type(exc).__name__}: "
                                      f"{exc}") from None

    # ------------------------------------------------------------------ on the MLX thread

    def _run(self, pieces: Sequence[Piece]) -> None:
        ones = [p for p in pieces if p.n_outputs]
        for piece in pieces:
            if cast(Row, piece.seq).n_kv != piece.start:
                raise BackendRuntimeError("a batched MLX row is out of step with its session")
        if ones:
            try:
                self._decode_step(ones)
            except BaseException:
                for piece in ones:
                    cast(Row, piece.seq).stale = True
                self._drop([cast(Row, p.seq) for p in ones])
                raise
        for piece in pieces:
            if not piece.n_outputs:
                try:
                    self._chunk(piece)
                except BaseException:
                    cast(Row, piece.seq).stale = True
                    raise

    def _decode_step(self, pieces: list[Piece]) -> None:
        """One batched forward: one token for each piece's row."""
        rows = [cast(Row, p.seq) for p in pieces]
        self._regroup(rows)
        index = {id(r): i for i, r in enumerate(self._live)}
        tokens = [0] * len(self._live)
        for row, piece in zip(rows, pieces, strict=True):
            tokens[index[id(row)]] = piece.tokens[0]
        with mx.stream(COMPUTE_STREAM):
            out = self.model(mx.array(tokens, dtype=mx.uint32)[:, None], cache=self._batch)
            host = np.array(out[:, -1, :].astype(mx.float32))
        for row in rows:
            self._outputs[id(row)] = host[index[id(row)]]
            row.n_kv += 1
        stats = self.stats
        stats.batched_steps += 1
        stats.rows += len(rows)
        stats.widest = max(stats.widest, len(rows))
        stats.widths[len(rows)] = stats.widths.get(len(rows), 0) + 1
        if not stats.batched_steps & 255:
            mx.clear_cache()  # as generate_step, every 256 steps

    def _chunk(self, piece: Piece) -> None:
        """A prompt chunk, alone on the row's own caches (state evaluated, logits never)."""
        row = cast(Row, piece.seq)
        self._rest([row])
        cache = _cache(row)
        with mx.stream(COMPUTE_STREAM):
            self.model(mx.array(list(piece.tokens), dtype=mx.uint32)[None], cache=cache)
            mx.eval([c.state for c in cache])
            mx.clear_cache()  # as generate_step: drop the chunk's temporaries
        row.n_kv += len(piece.tokens)
        self.stats.solo_chunks += 1

    def _regroup(self, rows: list[Row]) -> None:
        """Make the live batch hold exactly ``rows``: the others go to rest, missing ones join."""
        wanted = set(rows)
        self._rest([r for r in self._live if r not in wanted])
        live = set(self._live)
        joining = [r for r in rows if r not in live]
        if not joining:
            return
        merged = []
        for layer in range(self._n_layers):
            caches = [_cache(r)[layer] for r in joining]
            merged.append(BatchKVCache.merge(caches))  # type: ignore[no-untyped-call,unused-ignore]
        if self._live:
            for cache, other in zip(self._batch, merged, strict=True):
                cache.extend(other)
        else:
            self._batch = merged
        for r in joining:
            r.cache = None
        self._live.extend(joining)
        self.stats.moves += len(joining)

    def _rest(self, rows: list[Row]) -> None:
        """Move ``rows`` out of the live batch into their own caches."""
        self._leave(rows, keep_cache=True)

    def _drop(self, rows: list[Row]) -> None:
        """Take ``rows`` out of the live batch, discarding their cached positions."""
        self._leave(rows, keep_cache=False)

    def _leave(self, rows: list[Row], keep_cache: bool) -> None:
        going = {id(r) for r in rows}
        if not any(id(r) in going for r in self._live):
            return
        keep = []
        for i, r in enumerate(self._live):
            if id(r) not in going:
                keep.append(i)
            elif keep_cache:
                r.cache = [c.extract(i) for c in self._batch]
                self.stats.moves += 1
        if keep:
            for cache in self._batch:
                cache.filter(keep)
        else:
            self._batch = []
        self._live = [self._live[i] for i in keep]


def _cache(row: Row) -> list[Any]:
    assert row.cache is not None, "a live row has no cache at rest"
    return row.cache


def _no_output(_piece: Piece) -> None:
    return None


__all__ = ["BatchEngine", "EngineStats", "Row", "unbatchable"]
