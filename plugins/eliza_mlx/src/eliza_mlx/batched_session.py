"""The MLX session of a ``parallel > 1`` context: one row of the context's
:class:`~eliza_mlx.batch_engine.BatchEngine`, decoded in one batched forward with the other
sessions' rows (the engine's docstring says how, and why not mlx-lm's ``BatchGenerator``).

The cache is lazy by one: a sampled token stays *pending* (not fed) until the next ``next()``
or prefill feeds it, so the engine's one-token shares are the decoding sessions' pending tokens
(a prompt's last token is one too: its logits give the first sample). Sampling is the core's
:class:`~eliza_backends.runtime.sampling.Sampler` on the host, one seeded generator per session,
so a sampled sequence is the same whatever its batch-mates do; the logits hook
(``_guide``: constraints, logprobs) runs on the same row before it. Greedy sequences equal the
unbatched session's where the float arithmetic allows (the batched attention has padded,
masked columns; tests/test_mlx_batched.py measures it).

Not here: speculative drafters (the factory opens an ordinary session for them) and slots
(``capabilities.slots`` False). ``cancel()`` lands between tokens and between prompt chunks;
a waiting share finishes its step first (at most one step), never disturbing the other rows.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from eliza_backends import (
    BackendRuntimeError,
    Capabilities,
    Decoded,
    InferenceContext,
    Session,
    StreamConfig,
)
from eliza_backends.backend import Sampler

from .batch_engine import BatchEngine
from .model import LoadedMLX
from .session_hooks import TokenizerHooks, cut_lazy_cache


class BatchedMLXSession(TokenizerHooks, Session):
    """One sequence of a batched MLX context (a row of its :class:`BatchEngine`)."""

    backend_name = "mlx-coreml"

    def __init__(self, loaded: LoadedMLX, config: StreamConfig, context: InferenceContext,
                 engine: BatchEngine) -> None:
        self._tokenizer = loaded.tokenizer
        self._engine = engine
        self._row = engine.open_row()
        self._sampler = Sampler(config)
        self._logits: np.ndarray[Any, Any] | None = None  # after the last cached token
        self._pending: int | None = None  # the sequence's last token, not fed yet
        try:
            super().__init__(config, context, loaded.info)
        except BaseException:  # (the context closed meanwhile): free the row
            engine.close_row(self._row)
            raise

    @property
    def capabilities(self) -> Capabilities:
        return Capabilities(token_input=True, prefix_reuse=True, slots=False,
                            cancel_prefill=False, sampling=True, logits=True, batched=True)

    @property
    def engine(self) -> BatchEngine:
        """The context's batch engine this session is a row of (its ``stats`` show batching)."""
        return self._engine

    def _prefill(self, token_ids: list[int]) -> None:
        engine, row, step = self._engine, self._row, self.config.batch_size
        start, pending, cancelled = row.n_kv, self._pending, self._cancel_requested
        feed = token_ids if pending is None else [pending, *token_ids]
        body, last = feed[:-1], feed[-1:]
        self._logits = None
        try:
            for off in range(0, len(body), step):
                self._raise_if_cancelled()
                engine.forward(row, body[off:off + step], cancelled)
            self._raise_if_cancelled()
            self._logits = engine.forward(row, last, cancelled)
        except BaseException:
            self._logits = None
            if not row.stale and row.n_kv > start:  # (pieces of a cancelled share ran)
                engine.trim(row, row.n_kv - start)
            engine.idle(row)
            raise
        self._pending = None

    def _decode(self, max_tokens: int) -> Decoded:
        engine, row, guide, stops = self._engine, self._row, self._guide, self._stop_tokens
        cancelled = self._cancel_requested
        out: list[int] = []
        for i in range(max_tokens):
            if i:
                self._raise_if_cancelled()
            if self._pending is not None:
                self._logits = engine.forward(row, [self._pending], cancelled)
                self._pending = None
            logits = self._logits
            if logits is None:
                raise BackendRuntimeError("no logits to sample from: prefill first")
            if guide is not None:
                guide.prepare()
                logits = guide.process(logits)
            tok = self._sampler.sample(logits, [*self._sequence, *out])
            if guide is not None:
                guide.accept(tok)
            out.append(tok)
            self._pending, self._logits = tok, None
            if tok in stops:
                engine.idle(row)  # the stream ends: the next step does not wait for this row
                break
        else:
            if self._stream_ends_with(max_tokens):
                engine.idle(row)
        return Decoded(out)

    def _reset(self) -> None:
        self._engine.idle(self._row)
        self._engine.reset(self._row)
        self._pending = self._logits = None
        self._sampler.reset()

    def _truncate(self, n_keep: int) -> bool:
        row = self._row
        self._engine.idle(row)
        if row.stale:
            return False

        def trim(k: int) -> bool:
            self._engine.trim(row, k)
            return True

        done, pending = cut_lazy_cache(row.n_kv, n_keep, self._sequence, trim)
        if not done:
            return False
        self._pending = pending
        self._logits = None
        self._sampler.reset()
        return True

    def _close(self) -> None:
        self._engine.idle(self._row)
        self._engine.close_row(self._row)
        self._logits = None


__all__ = ["BatchedMLXSession"]
